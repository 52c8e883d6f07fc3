//! The admin API and `/metrics` (issue 6): bearer token, JSON endpoints, and counters that
//! move while a transfer runs.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use warren::{Client, HostPort, Server};

const ADMIN_TOKEN: &str = "admin-token-0123456789-abcdef";

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// A metric's value from a Prometheus text exposition.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

struct Admin {
    admin: SocketAddr,
    service: SocketAddr,
    _stop: tokio_util::sync::CancellationToken,
    _client_stop: tokio_util::sync::CancellationToken,
}

async fn server_with_admin(token: Option<&str>, target: SocketAddr) -> Admin {
    let bound = Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .psk(PSK)
        .default_token(TOKEN)
        .tcp_service("web", "127.0.0.1:0".parse().unwrap())
        .admin("127.0.0.1:0".parse().unwrap(), token)
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
        .psk(PSK)
        .default_token(TOKEN)
        .tcp_service("web", HostPort::from(target))
        .build()
        .unwrap();
    let mut status = client.status();
    let client_stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(client.run(client_stop.clone()));
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.connected))
        .await
        .unwrap()
        .unwrap();
    Admin {
        admin,
        service,
        _stop: stop,
        _client_stop: client_stop,
    }
}

#[tokio::test]
async fn admin_api_needs_the_bearer_token() {
    let target = echo_target().await;
    let setup = server_with_admin(Some(ADMIN_TOKEN), target).await;
    for path in ["/api/v1/status", "/api/v1/services", "/metrics"] {
        let (status, body) = http(setup.admin, "GET", path, None).await;
        assert_eq!(status, 401, "{path} without a token: {body}");
        let (status, _) = http(setup.admin, "GET", path, Some("wrong-token")).await;
        assert_eq!(status, 401, "{path} with a wrong token");
        let (status, _) = http(setup.admin, "GET", path, Some(ADMIN_TOKEN)).await;
        assert_eq!(status, 200, "{path} with the token");
    }
    let (_, body) = http(setup.admin, "GET", "/api/v1/status", Some(ADMIN_TOKEN)).await;
    let status = json(&body);
    assert_eq!(status["side"], "server");
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
    // The token never appears in any answer.
    for path in [
        "/api/v1/status",
        "/api/v1/sessions",
        "/api/v1/services",
        "/metrics",
    ] {
        let (_, body) = http(setup.admin, "GET", path, Some(ADMIN_TOKEN)).await;
        assert!(!body.contains(ADMIN_TOKEN) && !body.contains(PSK) && !body.contains(TOKEN));
    }
}

#[tokio::test]
async fn admin_api_without_token_on_loopback_lists_sessions_and_services() {
    let target = echo_target().await;
    let setup = server_with_admin(None, target).await;
    let (status, body) = http(setup.admin, "GET", "/api/v1/sessions", None).await;
    assert_eq!(status, 200);
    let sessions = json(&body);
    assert_eq!(sessions.as_array().unwrap().len(), 1, "{body}");
    assert_eq!(sessions[0]["services"][0], "web");
    assert!(sessions[0]["cipher"].as_str().unwrap().len() > 3);
    // Issue 20: how the cipher was chosen, with both sides' figures (default: fastest).
    let choice = &sessions[0]["cipher_choice"];
    assert_eq!(choice["decided_by"], "fastest", "{body}");
    for side in ["client", "server"] {
        let figures = choice[side].as_array().unwrap();
        assert!(!figures.is_empty(), "{side}: {body}");
        assert!(figures[0]["seal_mbps"].as_u64().unwrap() > 0, "{body}");
        assert!(figures.iter().any(|f| f["cipher"] == sessions[0]["cipher"]));
    }
    let (_, body) = http(setup.admin, "GET", "/api/v1/services", None).await;
    let services = json(&body);
    assert_eq!(services[0]["name"], "web");
    assert_eq!(services[0]["state"], "serving");
    let (status, body) = http(setup.admin, "POST", "/api/v1/reload", None).await;
    // Built in code, this server has no file to read again (tests/reload.rs covers one).
    assert_eq!(status, 501, "{body}");
    assert!(
        json(&body)["error"]
            .as_str()
            .unwrap()
            .contains("not started from a config file"),
        "{body}"
    );
}

#[tokio::test]
async fn metrics_move_while_a_transfer_runs() {
    let target = echo_target().await;
    let setup = server_with_admin(None, target).await;
    let series = r#"warren_service_bytes_total{service="web",direction="in"}"#;
    let series_out = r#"warren_service_bytes_total{service="web",direction="out"}"#;
    let chunk = random_bytes(32 * 1024);
    let chunks = 30;
    let mut visitor = TcpStream::connect(setup.service).await.unwrap();
    let mut echoed = Vec::new();
    let mut seen_in = Vec::new();
    let mut listed = false;
    for i in 0..chunks {
        visitor.write_all(&chunk).await.unwrap();
        let mut back = vec![0u8; chunk.len()];
        visitor.read_exact(&mut back).await.unwrap();
        echoed.extend_from_slice(&back);
        if i % 10 == 5 {
            // Mid-transfer: the counters already show the bytes that went through.
            let (status, text) = http(setup.admin, "GET", "/metrics", None).await;
            assert_eq!(status, 200);
            let bytes_in = metric(&text, series).unwrap_or_else(|| panic!("{series} in\n{text}"));
            let bytes_out = metric(&text, series_out).unwrap();
            assert!(bytes_in >= ((i + 1) * chunk.len()) as f64, "{bytes_in}");
            assert!(bytes_out >= ((i + 1) * chunk.len()) as f64, "{bytes_out}");
            assert_eq!(
                metric(&text, r#"warren_service_connections_active{service="web"}"#),
                Some(1.0)
            );
            seen_in.push(bytes_in);
            let (_, body) = http(setup.admin, "GET", "/api/v1/connections", None).await;
            let connections = json(&body);
            assert_eq!(connections[0]["service"], "web");
            assert!(connections[0]["bytes_in"].as_u64().unwrap() >= (i + 1) as u64 * 32768);
            listed = true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(listed);
    assert!(seen_in.windows(2).all(|w| w[0] < w[1]), "{seen_in:?}");
    assert!(seen_in.len() >= 2);
    // Bytes verified.
    let sent: Vec<u8> = chunk.repeat(chunks);
    assert_eq!(hash(&echoed), hash(&sent));
    drop(visitor);
    let (_, text) = http(setup.admin, "GET", "/metrics", None).await;
    assert_eq!(metric(&text, series), Some((chunks * chunk.len()) as f64));
    assert!(text.contains("warren_build_info{"));
    assert!(text.contains("warren_sessions_active 1"));
    assert!(text.contains("warren_connect_duration_seconds_count{service=\"web\"} 1"));
}

#[tokio::test]
async fn wrong_psk_counts_a_handshake_failure() {
    let target = echo_target().await;
    let bound = Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .psk(PSK)
        .default_token(TOKEN)
        .tcp_service("web", "127.0.0.1:0".parse().unwrap())
        .admin("127.0.0.1:0".parse().unwrap(), None)
        .build()
        .unwrap()
        .bind()
        .await
        .unwrap();
    let admin = bound.admin_addr().unwrap();
    let server = bound.local_addr();
    let _stop = bound.shutdown_token().drop_guard();
    tokio::spawn(bound.run());
    let setup = Setup {
        client_psk: "a-different-psk-0123456789".into(),
        ..Setup::default()
    };
    let client = start_client(&setup, server, target);
    let _client_stop = client.stop.clone().drop_guard();
    let series = r#"warren_handshake_failures_total{reason="bad_psk"}"#;
    let mut seen = None;
    for _ in 0..50 {
        let (_, text) = http(admin, "GET", "/metrics", None).await;
        seen = metric(&text, series);
        if seen.is_some_and(|v| v >= 1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen.is_some_and(|v| v >= 1.0), "{series}: {seen:?}");
}

/// Sends `payload` from `socket` to `entrance` until it comes back (a datagram may race its
/// channel's opening); returns how many copies were sent.
async fn echo_once(socket: &tokio::net::UdpSocket, entrance: SocketAddr, payload: &[u8]) -> usize {
    for sent in 1..=10 {
        socket.send_to(payload, entrance).await.unwrap();
        let mut buf = vec![0u8; 65_536];
        if let Ok(Ok(len)) =
            tokio::time::timeout(Duration::from_millis(500), socket.recv(&mut buf)).await
        {
            assert_eq!(&buf[..len], payload);
            return sent;
        }
    }
    panic!("a datagram of {} bytes never came back", payload.len());
}

#[tokio::test]
async fn udp_services_show_datagrams_bytes_and_drops_on_both_sides() {
    // Echoes every datagram but the quiet ones, which it only counts: traffic one way only
    // tells `in` from `out`.
    let target_socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let target = target_socket.local_addr().unwrap();
    let (quiet_tx, mut quiet_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok((len, peer)) = target_socket.recv_from(&mut buf).await {
            if buf[..len].starts_with(b"quiet") {
                let _ = quiet_tx.send(());
            } else {
                let _ = target_socket.send_to(&buf[..len], peer).await;
            }
        }
    });
    let bound = Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .psk(PSK)
        .default_token(TOKEN)
        .udp_service("dns", "127.0.0.1:0".parse().unwrap())
        .admin("127.0.0.1:0".parse().unwrap(), None)
        .build()
        .expect("valid server")
        .bind()
        .await
        .expect("binds");
    let server_admin = bound.admin_addr().expect("admin bound");
    let entrance = bound.service_addr("dns").unwrap();
    let server = bound.local_addr();
    let _stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    let visitor = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();

    // No client yet: what visitors send is dropped, and counted as such.
    for _ in 0..3 {
        visitor.send_to(b"nobody home", entrance).await.unwrap();
    }
    let dropped = r#"warren_udp_dropped_total{service="dns",reason="no_client"}"#;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, text) = http(server_admin, "GET", "/metrics", None).await;
        if metric(&text, dropped) == Some(3.0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{dropped}\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let client_admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let client = Client::builder(HostPort::from(server))
        .psk(PSK)
        .default_token(TOKEN)
        .udp_service("dns", HostPort::from(target))
        .admin(client_admin, None)
        .build()
        .unwrap();
    let mut status = client.status();
    let client_stop = tokio_util::sync::CancellationToken::new();
    let _client_stop = client_stop.clone().drop_guard();
    tokio::spawn(client.run(client_stop));
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.connected))
        .await
        .unwrap()
        .unwrap();

    let (mut sent, mut bytes) = (0, 0);
    for i in 0..20 {
        let payload = random_bytes(50 + 13 * i);
        let copies = echo_once(&visitor, entrance, &payload).await;
        sent += copies;
        bytes += copies * payload.len();
    }
    for _ in 0..5 {
        visitor.send_to(b"quiet", entrance).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), quiet_rx.recv())
            .await
            .expect("the quiet datagram reaches the target");
    }
    let (_, server_text) = http(server_admin, "GET", "/metrics", None).await;
    let (_, client_text) = http(client_admin, "GET", "/metrics", None).await;
    for (side, text) in [("server", &server_text), ("client", &client_text)] {
        let value = |series: &str| {
            metric(text, series).unwrap_or_else(|| panic!("{side}: no {series}\n{text}"))
        };
        // Every echoed datagram passed both ways, the quiet ones only in; a copy lost while
        // the channel opened may count on the way in only.
        let (datagrams_in, datagrams_out) = (
            value(r#"warren_udp_datagrams_total{service="dns",direction="in"}"#),
            value(r#"warren_udp_datagrams_total{service="dns",direction="out"}"#),
        );
        assert!(
            datagrams_out >= 20.0 && datagrams_in >= datagrams_out + 5.0,
            "{side}: {datagrams_in} in, {datagrams_out} out"
        );
        assert!(
            datagrams_in <= (sent + 5) as f64,
            "{side}: {datagrams_in} in of {sent} + 5 sent"
        );
        let bytes_in = value(r#"warren_service_bytes_total{service="dns",direction="in"}"#);
        let bytes_out = value(r#"warren_service_bytes_total{service="dns",direction="out"}"#);
        assert!(
            bytes_out >= (50..).step_by(13).take(20).sum::<usize>() as f64,
            "{side}: {bytes_out}"
        );
        assert!(
            bytes_in >= bytes_out + 25.0 && bytes_in <= (bytes + 25) as f64,
            "{side}: {bytes_in} of {bytes} + 25"
        );
        assert_eq!(
            value(r#"warren_udp_sessions_active{service="dns"}"#),
            1.0,
            "{side}"
        );
        assert_eq!(
            value(r#"warren_udp_dropped_total{service="dns",reason="queue_full"}"#),
            0.0,
            "{side}"
        );
    }
    assert_eq!(metric(&server_text, dropped), Some(3.0));
    assert_eq!(
        metric(
            &client_text,
            r#"warren_udp_dropped_total{service="dns",reason="no_client"}"#
        ),
        Some(0.0)
    );
}
