//! End-to-end tests for issue 5 with the real `warren` binary and real tools on loopback:
//! SOCKS5 (microsocks) and HTTP CONNECT (tinyproxy) proxies with and without auth, a
//! PROXY protocol consumer (HAProxy), and the `warren expose` / `warren forward`
//! one-liners. Bytes are checked by BLAKE3 hash in both directions.
//!
//! A missing tool skips its test with a note, unless `WARREN_E2E_REQUIRE_TOOLS=1` (as
//! `scripts/test.sh` sets), which makes it fail. Run against the release binary:
//! `cargo test --release -p warren --test e2e_proxy`.

mod e2e_support;

use std::net::SocketAddr;
use std::time::Duration;

use e2e_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PROXY_USER: &str = "warren";
const PROXY_PASSWORD: &str = "s3cret-proxy-pass";

/// A server with one reverse service `web`, returns (server proc, server port, web port).
async fn server_with_web(dir: &TestDir, extra: &str) -> (Proc, u16, u16) {
    let ports = Ports::pick();
    let config = dir.write(
        "server.toml",
        &format!(
            r#"[server]
bind = "127.0.0.1:{server}"
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
heartbeat_interval = "1s"
{extra}
[server.services.web]
bind = "127.0.0.1:{web}"
"#,
            server = ports.server,
            web = ports.web,
        ),
    );
    let server = start_server(dir, &config);
    wait_listening(ports.server, "warren server").await;
    (server, ports.server, ports.web)
}

fn client_config(
    dir: &TestDir,
    server_port: u16,
    target: SocketAddr,
    extra: &str,
) -> std::path::PathBuf {
    dir.write(
        "client.toml",
        &format!(
            r#"[client]
server = "127.0.0.1:{server_port}"
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
reconnect_initial_delay = "100ms"
reconnect_max_delay = "500ms"
{extra}
[client.services.web]
target = "{target}"
"#
        ),
    )
}

/// Hash-checked bytes both ways through `service` to a hashing target, retried while the
/// tunnel comes up.
async fn check_hashes(
    service: SocketAddr,
    served: &mut tokio::sync::mpsc::Receiver<Served>,
    client: &mut Proc,
) {
    let payload = random_bytes(3 * 1024 * 1024 + 11);
    for _ in 0..100 {
        match round_trip(service, &payload).await {
            Ok(reply) if !reply.is_empty() => {
                let got = served.recv().await.expect("target saw the stream");
                assert_eq!(got.received, blake3::hash(&payload), "visitor -> target");
                assert_eq!(got.sent, blake3::hash(&reply), "target -> visitor");
                return;
            }
            _ => {
                assert!(client.is_running(), "client exited: {}", client.stderr());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    panic!("no working tunnel\nclient stderr:\n{}", client.stderr());
}

fn microsocks(dir: &TestDir, auth: bool) -> (Proc, u16) {
    let port = free_port();
    let port_text = port.to_string();
    let mut args = vec!["-i", "127.0.0.1", "-p", &port_text];
    if auth {
        args.extend(["-u", PROXY_USER, "-P", PROXY_PASSWORD]);
    }
    (
        Proc::spawn(dir, "microsocks", "microsocks", &args, &[]),
        port,
    )
}

fn tinyproxy(dir: &TestDir, auth: bool, connect_port: u16) -> (Proc, u16) {
    let port = free_port();
    let auth_line = if auth {
        format!("BasicAuth {PROXY_USER} {PROXY_PASSWORD}\n")
    } else {
        String::new()
    };
    let config = dir.write(
        "tinyproxy.conf",
        &format!(
            "Port {port}\nListen 127.0.0.1\nTimeout 60\nMaxClients 100\nAllow 127.0.0.1\nConnectPort {connect_port}\nLogLevel Info\n{auth_line}"
        ),
    );
    let config = config.to_str().expect("utf-8").to_owned();
    (
        Proc::spawn(dir, "tinyproxy", "tinyproxy", &["-d", "-c", &config], &[]),
        port,
    )
}

async fn through_proxy(proxy_url: &str, dir: &TestDir, server_port: u16, web: u16) {
    let (target, mut served) = hashing_target(1024 * 1024 + 3).await;
    let config = client_config(
        dir,
        server_port,
        target,
        &format!("proxy = \"{proxy_url}\"\n"),
    );
    let mut client = start_client(dir, &config, PSK);
    check_hashes(loopback(web), &mut served, &mut client).await;
    // Data channels go through the proxy too: several streams at once.
    for _ in 0..3 {
        check_hashes(loopback(web), &mut served, &mut client).await;
    }
    assert!(
        !client.stderr().contains(PROXY_PASSWORD),
        "the proxy password leaked into the log"
    );
    client.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_proxy_with_and_without_auth_and_a_wrong_password() {
    if !have_tool("microsocks", "microsocks", "socks5_proxy") {
        return;
    }
    let dir = TestDir::new("socks5");
    let (mut server, server_port, web) = server_with_web(&dir, "").await;
    // Without auth.
    let (mut open_proxy, port) = microsocks(&dir, false);
    wait_listening(port, "microsocks").await;
    through_proxy(
        &format!("socks5://127.0.0.1:{port}"),
        &dir,
        server_port,
        web,
    )
    .await;
    open_proxy.kill();
    // With auth.
    let (mut auth_proxy, port) = microsocks(&dir, true);
    wait_listening(port, "microsocks").await;
    through_proxy(
        &format!("socks5://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{port}"),
        &dir,
        server_port,
        web,
    )
    .await;
    // Wrong password: a clear error, via -x on the command line.
    let config = client_config(&dir, server_port, loopback(9), "");
    let proxy = format!("socks5://{PROXY_USER}:wrong@127.0.0.1:{port}");
    let mut client = Proc::warren(
        &dir,
        "client-wrong",
        &["client", config.to_str().unwrap(), "-x", &proxy],
        &[("WARREN_PSK", PSK)],
    );
    assert!(
        client
            .stderr_contains_within(
                "refused authentication (check the user and password in `proxy`)",
                Duration::from_secs(10)
            )
            .await,
        "{}",
        client.stderr()
    );
    client.kill();
    auth_proxy.kill();
    server.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_connect_proxy_with_and_without_auth_and_a_wrong_password() {
    if !have_tool("tinyproxy", "tinyproxy", "http_connect_proxy") {
        return;
    }
    let dir = TestDir::new("tinyproxy");
    let (mut server, server_port, web) = server_with_web(&dir, "").await;
    let (mut open_proxy, port) = tinyproxy(&dir, false, server_port);
    wait_listening(port, "tinyproxy").await;
    through_proxy(&format!("http://127.0.0.1:{port}"), &dir, server_port, web).await;
    open_proxy.kill();

    let auth_dir = TestDir::new("tinyproxy-auth");
    let (mut auth_proxy, port) = tinyproxy(&auth_dir, true, server_port);
    wait_listening(port, "tinyproxy").await;
    through_proxy(
        &format!("http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{port}"),
        &auth_dir,
        server_port,
        web,
    )
    .await;
    let config = client_config(
        &auth_dir,
        server_port,
        loopback(9),
        &format!("proxy = \"http://{PROXY_USER}:wrong@127.0.0.1:{port}\"\n"),
    );
    let mut client = start_client(&auth_dir, &config, PSK);
    assert!(
        client
            .stderr_contains_within("refused authentication", Duration::from_secs(10))
            .await,
        "{}",
        client.stderr()
    );
    client.kill();
    auth_proxy.kill();
    server.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_proxy_is_a_clear_error() {
    let dir = TestDir::new("no-proxy");
    let port = free_port();
    let config = client_config(
        &dir,
        free_port(),
        loopback(9),
        &format!("proxy = \"socks5://127.0.0.1:{port}\"\n"),
    );
    let mut client = start_client(&dir, &config, PSK);
    let expected = format!("cannot reach proxy 127.0.0.1:{port}: Connection refused");
    assert!(
        client
            .stderr_contains_within(&expected, Duration::from_secs(10))
            .await,
        "{}",
        client.stderr()
    );
    client.kill();
}

/// HAProxy on a free port, expecting a PROXY header (`accept-proxy`) and answering every
/// request with the client address it saw: `visitor=IP:PORT`.
async fn haproxy(dir: &TestDir, version: &str) -> (Proc, u16) {
    let haproxy_port = free_port();
    let config = dir.write(
        &format!("haproxy-{version}.cfg"),
        &format!(
            r#"defaults
    mode http
    timeout connect 5s
    timeout client 10s
    timeout server 10s
frontend fe
    bind 127.0.0.1:{haproxy_port} accept-proxy
    http-request return status 200 content-type text/plain lf-string "visitor=%[src]:%[src_port]"
"#
        ),
    );
    let haproxy = Proc::spawn(
        dir,
        "haproxy",
        "haproxy",
        &["-db", "-f", config.to_str().unwrap()],
        &[],
    );
    wait_listening(haproxy_port, "haproxy").await;
    (haproxy, haproxy_port)
}

/// Visits `service` from 127.0.0.2 (an address nothing else uses) until HAProxy answers
/// through the tunnel, then checks that it logged that visitor's address and port.
async fn check_haproxy_saw_the_visitor(service: SocketAddr, version: &str, client: &mut Proc) {
    let mut seen = None;
    for _ in 0..100 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let Ok(mut visitor) = socket.connect(service).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let me = visitor.local_addr().unwrap();
        let _ = visitor
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await;
        let mut response = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), visitor.read_to_end(&mut response)).await;
        let text = String::from_utf8_lossy(&response).to_string();
        if text.contains("visitor=") {
            seen = Some((me, text));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (me, text) = seen.unwrap_or_else(|| panic!("no answer from haproxy\n{}", client.stderr()));
    assert!(
        text.contains(&format!("visitor=127.0.0.2:{}", me.port())),
        "{version}: haproxy saw the wrong address: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_sees_the_visitor_address_through_proxy_protocol() {
    if !have_tool("haproxy", "haproxy", "haproxy_proxy_protocol") {
        return;
    }
    let dir = TestDir::new("haproxy");
    for version in ["v1", "v2"] {
        let (mut haproxy, haproxy_port) = haproxy(&dir, version).await;
        let (mut server, server_port, web) = server_with_web(&dir, "").await;
        let client_cfg = dir.write(
            "client-pp.toml",
            &format!(
                r#"[client]
server = "127.0.0.1:{server_port}"
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
[client.services.web]
target = "127.0.0.1:{haproxy_port}"
proxy_protocol = "{version}"
"#
            ),
        );
        let mut client = start_client(&dir, &client_cfg, PSK);
        check_haproxy_saw_the_visitor(loopback(web), version, &mut client).await;
        client.terminate();
        server.terminate();
        haproxy.kill();
    }
}

/// Issue 5: on a *forward* service the server writes the header, with the address of the
/// visitor that connected to the client's `bind`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_sees_the_forward_visitor_address_through_proxy_protocol() {
    if !have_tool("haproxy", "haproxy", "haproxy_forward_proxy_protocol") {
        return;
    }
    let dir = TestDir::new("haproxy-forward");
    for version in ["v1", "v2"] {
        let (mut haproxy, haproxy_port) = haproxy(&dir, version).await;
        let server_port = free_port();
        let server_cfg = dir.write(
            "server-fwd.toml",
            &format!(
                r#"[server]
bind = "127.0.0.1:{server_port}"
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
[server.services.web]
target = "127.0.0.1:{haproxy_port}"
proxy_protocol = "{version}"
"#
            ),
        );
        let mut server = start_server(&dir, &server_cfg);
        wait_listening(server_port, "warren server").await;
        let local_port = free_port();
        let client_cfg = dir.write(
            "client-fwd.toml",
            &format!(
                r#"[client]
server = "127.0.0.1:{server_port}"
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
[client.services.web]
bind = "127.0.0.1:{local_port}"
"#
            ),
        );
        let mut client = start_client(&dir, &client_cfg, PSK);
        check_haproxy_saw_the_visitor(loopback(local_port), version, &mut client).await;
        client.terminate();
        server.terminate();
        haproxy.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expose_one_liner_prints_its_public_address_and_carries_bytes() {
    let dir = TestDir::new("expose");
    let (mut server, server_port, _web) =
        server_with_web(&dir, "allow_ports = \"20000-29999\"\n").await;
    let (target, mut served) = hashing_target(1024 * 1024).await;
    let local = target.port().to_string();
    let to = format!("127.0.0.1:{server_port}");
    let mut expose = Proc::warren(
        &dir,
        "expose",
        &["expose", &local, "--to", &to],
        &[("WARREN_PSK", PSK), ("WARREN_TOKEN", TOKEN)],
    );
    let out = expose
        .wait_stdout("Exposed ", Duration::from_secs(10))
        .await;
    let line = out.lines().find(|l| l.starts_with("Exposed ")).unwrap();
    assert!(
        line.starts_with(&format!("Exposed 127.0.0.1:{local} at 127.0.0.1:")),
        "{line}"
    );
    let public: SocketAddr = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((20000..=29999).contains(&public.port()));
    check_hashes(public, &mut served, &mut expose).await;
    let logs = expose.stderr();
    assert!(
        !logs.contains(PSK) && !logs.contains(TOKEN),
        "a secret leaked into the log"
    );
    // A port outside the range: a clear refusal, and the command fails.
    let mut refused = Proc::warren(
        &dir,
        "expose-refused",
        &["expose", &local, "--to", &to, "--remote-port", "80"],
        &[("WARREN_PSK", PSK), ("WARREN_TOKEN", TOKEN)],
    );
    assert_eq!(refused.expect_exit(Duration::from_secs(10)).await, 1);
    assert!(
        refused
            .stderr()
            .contains("port 80 is outside the server's allow_ports 20000-29999"),
        "{}",
        refused.stderr()
    );
    expose.terminate();
    server.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_one_liner_reaches_a_target_the_server_names() {
    let dir = TestDir::new("forward");
    let (target, mut served) = hashing_target(777_777).await;
    let server_port = free_port();
    let config = dir.write(
        "server.toml",
        &format!(
            r#"[server]
bind = "127.0.0.1:{server_port}"
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
[server.services.db]
target = "{target}"
"#
        ),
    );
    let mut server = start_server(&dir, &config);
    wait_listening(server_port, "warren server").await;
    let local_port = free_port();
    let psk_file = dir.write("psk", &format!("{PSK}\n"));
    let mut forward = Proc::warren(
        &dir,
        "forward",
        &[
            "forward",
            "-l",
            &local_port.to_string(),
            "-r",
            &format!("127.0.0.1:{server_port}"),
            "-t",
            &target.to_string(),
            "--psk-file",
            psk_file.to_str().unwrap(),
        ],
        &[("WARREN_TOKEN", TOKEN)],
    );
    check_hashes(loopback(local_port), &mut served, &mut forward).await;
    check_hashes(loopback(local_port), &mut served, &mut forward).await;
    // A target the server does not name is refused.
    let mut other = Proc::warren(
        &dir,
        "forward-other",
        &[
            "forward",
            "-l",
            &free_port().to_string(),
            "-r",
            &format!("127.0.0.1:{server_port}"),
            "-t",
            "127.0.0.1:22",
        ],
        &[("WARREN_PSK", PSK), ("WARREN_TOKEN", TOKEN)],
    );
    assert_eq!(other.expect_exit(Duration::from_secs(10)).await, 1);
    assert!(
        other.stderr().contains("refused every service"),
        "{}",
        other.stderr()
    );
    forward.terminate();
    server.terminate();
}

/// `warren doctor` with a client config that names a proxy: it probes the proxy, runs the
/// handshake through it, and names a wrong password or a dead proxy with a fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_the_proxy_and_shakes_hands_through_it() {
    if !have_tool("microsocks", "microsocks", "doctor_checks_the_proxy") {
        return;
    }
    let dir = TestDir::new("doctor-proxy");
    let (mut server, server_port, _web) = server_with_web(&dir, "").await;
    let (target, _served) = hashing_target(16).await;
    let (mut socks, socks_port) = microsocks(&dir, true);
    wait_listening(socks_port, "microsocks").await;
    let doctor = |config: std::path::PathBuf| {
        let dir = &dir;
        async move {
            Proc::warren_output(
                dir,
                "doctor",
                &["doctor", config.to_str().unwrap()],
                &[("WARREN_PSK", PSK)],
            )
            .await
        }
    };

    let good =
        format!("proxy = \"socks5://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{socks_port}\"\n");
    let (code, out, err) = doctor(client_config(&dir, server_port, target, &good)).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("[OK]   proxy"), "{out}");
    assert!(
        out.contains("[OK]   handshake") && out.contains("via socks5://"),
        "{out}"
    );
    assert!(
        !out.contains(PROXY_PASSWORD),
        "the proxy password leaked: {out}"
    );

    let wrong =
        format!("proxy = \"socks5://{PROXY_USER}:not-the-password@127.0.0.1:{socks_port}\"\n");
    let (code, out, _) = doctor(client_config(&dir, server_port, target, &wrong)).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("[FAIL] proxy"), "{out}");
    assert!(
        out.contains("password"),
        "the fix names the credentials: {out}"
    );

    socks.terminate();
    let (code, out, _) = doctor(client_config(&dir, server_port, target, &good)).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("[FAIL] proxy") && out.contains("proxy running"),
        "{out}"
    );
    server.terminate();
}

/// A UDP echo service on loopback that sends every datagram back to its sender.
async fn udp_echo() -> SocketAddr {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok((len, from)) = socket.recv_from(&mut buf).await {
            let _ = socket.send_to(&buf[..len], from).await;
        }
    });
    addr
}

/// Sends 40 random datagrams of varied sizes to `public` and checks each comes back
/// byte for byte. UDP may drop, so a datagram is re-sent (up to 5 times) when no echo
/// arrives within a second; late echoes of earlier datagrams are skipped.
async fn check_udp_echoes(public: SocketAddr, proc: &mut Proc) {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.connect(public).await.unwrap();
    let mut buf = vec![0u8; 65_536];
    for i in 0..40usize {
        let payload = random_bytes(1 + (i * 397) % 1400);
        let mut echoed = false;
        for _ in 0..5 {
            socket.send(&payload).await.unwrap();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
            // An error here is ICMP "port unreachable" while the one-liner is still
            // starting: wait out the second and send again.
            while let Ok(received) = tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await
            {
                if received.is_ok_and(|len| buf[..len] == payload[..]) {
                    echoed = true;
                    break;
                }
            }
            if echoed {
                break;
            }
        }
        assert!(
            echoed,
            "datagram {i} ({} bytes) never came back through {public}\n{}",
            payload.len(),
            proc.stderr()
        );
    }
}

/// `warren expose --udp` and `warren forward --udp`: the one-liners carry datagrams too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_one_liners_carry_datagrams() {
    let dir = TestDir::new("udp-one-liners");
    let echo = udp_echo().await;
    let server_port = free_port();
    let config = dir.write(
        "server.toml",
        &format!(
            r#"[server]
bind = "127.0.0.1:{server_port}"
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
allow_ports = "20000-29999"
[server.services.dns]
type = "udp"
target = "{echo}"
"#
        ),
    );
    let mut server = start_server(&dir, &config);
    wait_listening(server_port, "warren server").await;
    let to = format!("127.0.0.1:{server_port}");
    let secrets = [("WARREN_PSK", PSK), ("WARREN_TOKEN", TOKEN)];

    let mut expose = Proc::warren(
        &dir,
        "expose-udp",
        &["expose", &echo.to_string(), "--to", &to, "--udp"],
        &secrets,
    );
    let out = expose
        .wait_stdout("Exposed ", Duration::from_secs(10))
        .await;
    let line = out.lines().find(|l| l.starts_with("Exposed ")).unwrap();
    assert!(
        line.starts_with(&format!("Exposed udp://{echo} at udp://127.0.0.1:")),
        "{line}"
    );
    let public: SocketAddr = line.rsplit("udp://").next().unwrap().parse().unwrap();
    assert!((20000..=29999).contains(&public.port()));
    check_udp_echoes(public, &mut expose).await;
    expose.terminate();

    let local_port = free_port();
    let mut forward = Proc::warren(
        &dir,
        "forward-udp",
        &[
            "forward",
            "-l",
            &local_port.to_string(),
            "-r",
            &to,
            "-t",
            &echo.to_string(),
            "--udp",
        ],
        &secrets,
    );
    check_udp_echoes(loopback(local_port), &mut forward).await;
    forward.terminate();
    server.terminate();
}

/// Issue 19: `transport = "tls"` through tinyproxy (HTTP CONNECT), bytes hash checked. The
/// server port takes `noise` and `tls` side by side; the proxy sees only TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_transport_through_an_http_connect_proxy() {
    if !have_tool(
        "tinyproxy",
        "tinyproxy",
        "tls_transport_through_an_http_connect_proxy",
    ) {
        return;
    }
    let dir = TestDir::new("tls-connect");
    let cert = dir.path().join("tls.pem");
    let (mut server, server_port, web) = server_with_web(
        &dir,
        &format!(
            "transport = \"tls\"\n[server.tls]\ncert = \"{}\"\n",
            cert.display()
        ),
    )
    .await;
    let (mut proxy, port) = tinyproxy(&dir, false, server_port);
    wait_listening(port, "tinyproxy").await;
    let (target, mut served) = hashing_target(1024 * 1024 + 3).await;
    let config = client_config(
        &dir,
        server_port,
        target,
        &format!("transport = \"tls\"\nproxy = \"http://127.0.0.1:{port}\"\n"),
    );
    let mut client = start_client(&dir, &config, PSK);
    for _ in 0..3 {
        check_hashes(loopback(web), &mut served, &mut client).await;
    }
    client.terminate();
    proxy.kill();
    server.terminate();
}

/// nginx as a WebSocket reverse proxy in front of a `ws` Warren server: plain HTTP on
/// `plain`, and TLS on `tls` with `cert` (PEM holding the key too), both passing `/warren`
/// with the upgrade headers, as the README shows.
fn nginx_websocket_proxy(
    dir: &TestDir,
    plain: u16,
    tls: u16,
    cert: &std::path::Path,
    warren: u16,
) -> Proc {
    let location = format!(
        "location /warren {{ proxy_pass http://127.0.0.1:{warren}; proxy_http_version 1.1; proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection \"upgrade\"; proxy_read_timeout 1h; proxy_buffering off; }}"
    );
    spawn_nginx(
        dir,
        &format!(
            "  server {{ listen 127.0.0.1:{plain}; {location} }}\n  server {{ listen 127.0.0.1:{tls} ssl; ssl_protocols TLSv1.2 TLSv1.3; ssl_certificate {cert}; ssl_certificate_key {cert}; {location} }}",
            cert = cert.display(),
        ),
    )
}

/// Issue 19: a `ws` client and a `wss` client reach a `ws` Warren server through nginx
/// (`proxy_pass` with `Upgrade`; for `wss` nginx terminates the TLS, as a CDN would, and
/// sees only Noise records: the client's TLS proof does not match, so the records keep
/// their cipher). Bytes hash checked on several streams each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_and_wss_through_nginx_as_a_websocket_reverse_proxy() {
    if !have_tool("nginx", "nginx", "ws_and_wss_through_nginx") {
        return;
    }
    let dir = TestDir::new("ws-nginx");
    // The server makes a self-signed certificate (key in the same PEM) that nginx presents.
    let cert = dir.path().join("tls.pem");
    let (mut server, server_port, web) = server_with_web(
        &dir,
        &format!(
            "transport = \"ws\"\n[server.tls]\ncert = \"{}\"\n",
            cert.display()
        ),
    )
    .await;
    assert!(cert.is_file(), "the server made its certificate");
    let (plain, tls) = (free_port(), free_port());
    let mut nginx = nginx_websocket_proxy(&dir, plain, tls, &cert, server_port);
    wait_listening(plain, "nginx").await;
    wait_listening(tls, "nginx").await;
    for (transport, port) in [("ws", plain), ("wss", tls)] {
        let client_dir = TestDir::new(&format!("ws-nginx-{transport}"));
        let (target, mut served) = hashing_target(512 * 1024 + 5).await;
        let config = client_config(
            &client_dir,
            port,
            target,
            &format!("transport = \"{transport}\"\n[client.ws]\nhost = \"tunnel.example.com\"\n"),
        );
        let mut client = start_client(&client_dir, &config, PSK);
        for _ in 0..3 {
            check_hashes(loopback(web), &mut served, &mut client).await;
        }
        // nginx ended the client's TLS: its proof cannot match, the cipher stays.
        let logs = client.logs();
        assert!(logs.contains("session_started"), "{logs}");
        assert!(!logs.contains("tls1.3"), "records left unencrypted: {logs}");
        client.terminate();
    }
    nginx.kill();
    server.terminate();
}

/// One echo exchange of `message` on an open visitor connection, within 3 s: whether it
/// came back whole.
async fn echoes(stream: &mut tokio::net::TcpStream, message: &[u8]) -> bool {
    let exchange = async {
        stream.write_all(message).await?;
        let mut back = vec![0; message.len()];
        stream.read_exact(&mut back).await?;
        std::io::Result::Ok(back == message)
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(3), exchange).await,
        Ok(Ok(true))
    )
}

/// Issue 19: WebSocket keepalive pings. nginx closes an upgraded connection that reads
/// nothing from either side for `proxy_read_timeout` (here 2 s, as a CDN closes an idle
/// WebSocket after 100 s). A visitor's connection that stays quiet for 5 s survives it when
/// both Warren ends ping every 500 ms (`[server.ws]`/`[client.ws] ping_interval`), and — the
/// control, so the test can fail — is cut when they ping at the default 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_keep_a_quiet_stream_through_a_proxy_with_an_idle_timeout() {
    if !have_tool("nginx", "nginx", "pings_keep_a_quiet_stream") {
        return;
    }
    let echo = echo_target().await;
    let mut outcomes = Vec::new();
    for ping in ["500ms", "30s"] {
        let side_dir = TestDir::new(&format!("ws-pings-{}", ping.trim_end_matches('s')));
        let ws = format!("transport = \"ws\"\n[server.ws]\nping_interval = \"{ping}\"\n");
        let (mut server, server_port, web) = server_with_web(&side_dir, &ws).await;
        let front = free_port();
        let mut nginx = spawn_nginx(
            &side_dir,
            &format!(
                "  server {{ listen 127.0.0.1:{front}; location /warren {{ proxy_pass http://127.0.0.1:{server_port}; proxy_http_version 1.1; proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection \"upgrade\"; proxy_read_timeout 2s; proxy_send_timeout 2s; proxy_buffering off; }} }}"
            ),
        );
        wait_listening(front, "nginx").await;
        let config = client_config(
            &side_dir,
            front,
            echo,
            &format!("transport = \"ws\"\n[client.ws]\nping_interval = \"{ping}\"\n"),
        );
        let mut client = start_client(&side_dir, &config, PSK);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut visitor = loop {
            if let Ok(mut stream) = tokio::net::TcpStream::connect(loopback(web)).await
                && echoes(&mut stream, b"hello").await
            {
                break stream;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no tunnel through nginx\n{}",
                client.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // Quiet for longer than nginx's idle timeout, then talk again.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let survived = echoes(&mut visitor, b"still there?").await;
        eprintln!(
            "ping_interval {ping}: the quiet stream survived nginx's 2 s idle timeout: {survived}"
        );
        outcomes.push(survived);
        client.terminate();
        nginx.kill();
        server.terminate();
    }
    assert_eq!(
        outcomes,
        [true, false],
        "pings every 500 ms must keep the stream; at 30 s nginx must cut it (else the test proves nothing)"
    );
}
