//! P2P services in client configs (issue 18, `p2p = true`), in process: two Warren
//! clients of one server, one with `target` (the exit), one with `bind` (the entrance),
//! meet by the service's name and carry TCP connections and UDP flows between themselves,
//! bytes checked by hash; each client's admin API and `/metrics` say, per P2P service,
//! direct or relayed, the peer's RTT and the bytes; a wrong token is refused and shown; a
//! pinned long-term identity is required of the other end; a reload restarts only the P2P
//! service that changed.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;
use tokio_util::sync::CancellationToken;
use warren::{Client, ClientConfig, Server};

const SSH_TOKEN: &str = "p2p-ssh-token-0123456789";
const DNS_TOKEN: &str = "p2p-dns-token-0123456789";

/// Starts a client from `services` (TOML of `[client.services.*]` tables) with its admin
/// API on a free port; returns the admin address and the client's stop token.
fn client(server: SocketAddr, services: &str) -> (SocketAddr, CancellationToken) {
    let (admin, stop, _) = reloadable_client(server, services);
    (admin, stop)
}

/// The client's config text: `services` under a `[client]` for `server`, with the admin
/// API on `admin`.
fn client_config(server: SocketAddr, admin: SocketAddr, services: &str) -> ClientConfig {
    let text = format!(
        "[admin]\nbind = \"{admin}\"\n[client]\nserver = \"{server}\"\npsk = \"{PSK}\"\n{services}"
    );
    ClientConfig::from_toml_str(&text, "client.toml").expect("valid client config")
}

/// [`client`], with its reloader.
fn reloadable_client(
    server: SocketAddr,
    services: &str,
) -> (
    SocketAddr,
    CancellationToken,
    warren::Reloader<ClientConfig>,
) {
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let client = Client::from_config(client_config(server, admin, services)).expect("client");
    let reloader = client.reloader();
    let stop = CancellationToken::new();
    let run = client.run(stop.clone());
    tokio::spawn(async move {
        if let Err(error) = run.await {
            panic!("the client stopped: {error}");
        }
    });
    (admin, stop, reloader)
}

/// The admin API's entry for P2P service `name`, once `ready` holds for it (30 s at most).
async fn service_when(
    admin: SocketAddr,
    name: &str,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    // The admin API comes up with the client.
    while tokio::net::TcpStream::connect(admin).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no admin API on {admin}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    loop {
        let (status, body) = http(admin, "GET", "/api/v1/services", None).await;
        if status == 200 {
            let services: serde_json::Value = serde_json::from_str(&body).unwrap();
            if let Some(service) = services
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == name)
                && ready(service)
            {
                return service.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} never got there: {body}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// TCP round trips of random payloads through `entrance`, checked by hash.
async fn check_tcp(entrance: SocketAddr, count: usize) {
    for i in 0..count {
        let payload = random_bytes(200_000 + i);
        let reply = tokio::time::timeout(Duration::from_secs(30), round_trip(entrance, &payload))
            .await
            .expect("in time")
            .expect("round trip");
        assert_eq!(hash(&reply), hash(&payload), "connection {i}");
    }
}

/// A running server whose `[server.p2p]` offers `services` (name, token); its address,
/// and what stops it when dropped.
async fn p2p_server(services: &[(&str, &str)]) -> (SocketAddr, StopOnDrop) {
    let sections: String = services
        .iter()
        .map(|(name, token)| format!("[server.p2p.services.{name}]\ntoken = \"{token}\"\n"))
        .collect();
    let bound = Server::from_config(p2p_server_config(&sections))
        .unwrap()
        .bind()
        .await
        .unwrap();
    let server = bound.local_addr();
    let stop = StopOnDrop(bound.shutdown_token());
    tokio::spawn(bound.run());
    (server, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_carry_a_tcp_and_a_udp_p2p_service_and_report_them() {
    let (server, _server_stop) = p2p_server(&[("ssh", SSH_TOKEN), ("dns", DNS_TOKEN)]).await;

    let (tcp_target, udp_target) = (echo_target().await, udp_echo_target().await);
    let (exit_admin, exit_stop) = client(
        server,
        &format!(
            "[client.services.ssh]\ntarget = \"{tcp_target}\"\np2p = true\ntoken = \"{SSH_TOKEN}\"\n\
             [client.services.dns]\ntype = \"udp\"\ntarget = \"{udp_target}\"\np2p = true\ntoken = \"{DNS_TOKEN}\"\n"
        ),
    );
    let _exit_stop = StopOnDrop(exit_stop);
    let ssh: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let dns: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (entrance_admin, entrance_stop) = client(
        server,
        &format!(
            "[client.services.ssh]\nbind = \"{ssh}\"\np2p = true\ntoken = \"{SSH_TOKEN}\"\n\
             [client.services.dns]\ntype = \"udp\"\nbind = \"{dns}\"\np2p = true\ntoken = \"{DNS_TOKEN}\"\n"
        ),
    );
    let _entrance_stop = StopOnDrop(entrance_stop);

    // Both services connect, peer to peer on loopback.
    for name in ["ssh", "dns"] {
        let service = service_when(entrance_admin, name, |s| s["state"] == "direct").await;
        assert_eq!(service["p2p"]["end"], "entrance", "{service}");
        assert_eq!(
            service["address"],
            if name == "ssh" { ssh } else { dns }.to_string()
        );
    }
    check_tcp(ssh, 8).await;
    check_udp_echoes(dns, 16).await;

    // Each side's admin API counts what went through, and says the route and RTT.
    let exit = service_when(exit_admin, "ssh", |s| s["total_connections"] == 8).await;
    assert_eq!(exit["p2p"]["end"], "exit", "{exit}");
    assert_eq!(exit["state"], "direct");
    assert_eq!(exit["address"], tcp_target.to_string());
    let peers = exit["p2p"]["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 1, "{exit}");
    assert_eq!(peers[0]["route"], "direct");
    assert!(peers[0]["rtt_ms"].as_f64().unwrap() > 0.0, "{exit}");
    let entrance = service_when(entrance_admin, "ssh", |s| s["total_connections"] == 8).await;
    let sent: u64 = (0..8).map(|i| 200_000 + i).sum();
    assert_eq!(entrance["bytes_in"], sent, "{entrance}");
    assert_eq!(entrance["bytes_out"], sent, "{entrance}");
    assert_eq!(entrance["errors"], 0);
    let (_, metrics) = http(entrance_admin, "GET", "/metrics", None).await;
    assert!(
        metrics.lines().any(
            |line| line.starts_with("warren_p2p_peer_rtt_seconds{service=\"ssh\"")
                && line.contains("route=\"direct\"")
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "warren_service_bytes_total{{service=\"ssh\",direction=\"in\"}} {sent}"
        )),
        "{metrics}"
    );
    // The UDP service's payload bytes count on both ends, each way (at least once each:
    // `check_udp_echoes` resends a datagram whose echo was slow).
    let datagrams: u64 = (0..2)
        .flat_map(|n| (0..16).map(move |i| 100 + 37 * i + n))
        .sum();
    for admin in [entrance_admin, exit_admin] {
        let dns = service_when(admin, "dns", |s| {
            s["bytes_in"].as_u64() >= Some(datagrams) && s["bytes_out"].as_u64() >= Some(datagrams)
        })
        .await;
        assert!(dns["bytes_in"].as_u64() < Some(4 * datagrams), "{dns}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_and_shown_while_the_port_stays_bound() {
    let (server, _server_stop) = p2p_server(&[("ssh", SSH_TOKEN)]).await;
    let target = echo_target().await;
    let (_, exit_stop) = client(
        server,
        &format!(
            "[client.services.ssh]\ntarget = \"{target}\"\np2p = true\ntoken = \"{SSH_TOKEN}\"\n"
        ),
    );
    let _exit_stop = StopOnDrop(exit_stop);
    let ssh: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (admin, stop) = client(
        server,
        &format!(
            "[client.services.ssh]\nbind = \"{ssh}\"\np2p = true\ntoken = \"wrong-token-0123456789-abc\"\n"
        ),
    );
    let _stop = StopOnDrop(stop);
    let service = service_when(admin, "ssh", |s| s["state"] == "refused").await;
    let error = service["p2p"]["last_error"].as_str().unwrap();
    assert!(error.contains("token"), "{service}");
    // Visitors are turned away at once, not left hanging.
    let reply = tokio::time::timeout(Duration::from_secs(5), round_trip(ssh, b"hello")).await;
    assert!(
        matches!(reply, Ok(Err(_)) | Ok(Ok(_))),
        "a visitor waited: {reply:?}"
    );
    if let Ok(Ok(bytes)) = reply {
        assert!(bytes.is_empty(), "bytes came back without a peer");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_long_term_identity_is_required_of_the_other_end() {
    let (server, _server_stop) = p2p_server(&[("ssh", SSH_TOKEN)]).await;
    let dir = std::env::temp_dir().join(format!("warren-p2p-identity-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exit_key = dir.join("exit.key");
    // `warren p2p identity` creates the file and prints this; a second read is the same.
    let exit_id = warren::p2p::transfer::identity::Identity::load_or_create(&exit_key)
        .unwrap()
        .fingerprint();
    let again = warren::p2p::transfer::identity::Identity::load_or_create(&exit_key)
        .unwrap()
        .fingerprint();
    assert_eq!(
        exit_id.hex(),
        again.hex(),
        "the identity outlives a restart"
    );
    let stranger =
        warren::p2p::transfer::identity::Identity::load_or_create(&dir.join("other.key"))
            .unwrap()
            .fingerprint();

    let target = echo_target().await;
    let (_, exit_stop) = client(
        server,
        &format!(
            "p2p_identity = \"{}\"\n[client.services.ssh]\ntarget = \"{target}\"\np2p = true\ntoken = \"{SSH_TOKEN}\"\n",
            exit_key.display()
        ),
    );
    let _exit_stop = StopOnDrop(exit_stop);
    // Pinned right: works, over the Ed25519 identity.
    let ssh: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (admin, stop) = client(
        server,
        &format!(
            "[client.services.ssh]\nbind = \"{ssh}\"\np2p = true\ntoken = \"{SSH_TOKEN}\"\npeer = \"{}\"\n",
            exit_id.hex()
        ),
    );
    let _stop = StopOnDrop(stop);
    service_when(admin, "ssh", |s| s["state"] == "direct").await;
    check_tcp(ssh, 2).await;
    // Pinned to another machine's identity: refused, and the reason names both.
    let other: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (admin, stop) = client(
        server,
        &format!(
            "[client.services.ssh]\nbind = \"{other}\"\np2p = true\ntoken = \"{SSH_TOKEN}\"\npeer = \"{}\"\n",
            stranger.hex()
        ),
    );
    let _stop = StopOnDrop(stop);
    let refused = service_when(admin, "ssh", |s| s["state"] == "refused").await;
    let error = refused["p2p"]["last_error"].as_str().unwrap();
    assert!(
        error.contains(&exit_id.hex()) && error.contains(&stranger.hex()),
        "{refused}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_restarts_only_the_p2p_service_that_changed() {
    let (server, _server_stop) = p2p_server(&[("ssh", SSH_TOKEN), ("dns", DNS_TOKEN)]).await;
    let (tcp_target, udp_target) = (echo_target().await, udp_echo_target().await);
    let (_, exit_stop) = client(
        server,
        &format!(
            "[client.services.ssh]\ntarget = \"{tcp_target}\"\np2p = true\ntoken = \"{SSH_TOKEN}\"\n\
             [client.services.dns]\ntype = \"udp\"\ntarget = \"{udp_target}\"\np2p = true\ntoken = \"{DNS_TOKEN}\"\n"
        ),
    );
    let _exit_stop = StopOnDrop(exit_stop);
    let ports = || -> SocketAddr { format!("127.0.0.1:{}", free_port()).parse().unwrap() };
    let (ssh, moved_ssh, dns) = (ports(), ports(), ports());
    let services = |ssh: SocketAddr| {
        format!(
            "[client.services.ssh]\nbind = \"{ssh}\"\np2p = true\ntoken = \"{SSH_TOKEN}\"\n\
             [client.services.dns]\ntype = \"udp\"\nbind = \"{dns}\"\np2p = true\ntoken = \"{DNS_TOKEN}\"\n"
        )
    };
    let (admin, stop, reloader) = reloadable_client(server, &services(ssh));
    let _stop = StopOnDrop(stop);
    for name in ["ssh", "dns"] {
        service_when(admin, name, |s| s["state"] == "direct").await;
    }
    check_tcp(ssh, 1).await;
    check_udp_echoes(dns, 4).await;
    let dns_peer = service_when(admin, "dns", |_| true).await["p2p"]["peers"][0]["peer"].clone();

    // The ssh service moves to another port; dns is left alone.
    let summary = reloader
        .apply(client_config(server, admin, &services(moved_ssh)))
        .await
        .expect("reload applies");
    assert!(
        summary
            .applied
            .iter()
            .any(|line| line.contains("P2P service ssh")),
        "{summary:?}"
    );
    assert!(
        !summary
            .applied
            .iter()
            .any(|line| line.contains("P2P service dns")),
        "{summary:?}"
    );
    service_when(admin, "ssh", |s| {
        s["state"] == "direct" && s["address"] == moved_ssh.to_string()
    })
    .await;
    check_tcp(moved_ssh, 2).await;
    assert!(
        tokio::net::TcpStream::connect(ssh).await.is_err(),
        "the old port still listens"
    );
    // dns kept its connection (the same peer) and works.
    let dns_now = service_when(admin, "dns", |_| true).await;
    assert_eq!(dns_now["p2p"]["peers"][0]["peer"], dns_peer, "{dns_now}");
    check_udp_echoes(dns, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_first_server_down_the_ends_meet_at_the_second() {
    let (live, _server_stop) = p2p_server(&[("ssh", SSH_TOKEN)]).await;
    // Nothing listens on the first server's port.
    let down: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let start = |services: String| {
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let text = format!(
            "[admin]\nbind = \"{admin}\"\n[client]\nservers = [\"{down}\", \"{live}\"]\npsk = \"{PSK}\"\n{services}"
        );
        let config = ClientConfig::from_toml_str(&text, "client.toml").expect("valid config");
        let client = Client::from_config(config).expect("client");
        let stop = CancellationToken::new();
        tokio::spawn(client.run(stop.clone()));
        (admin, StopOnDrop(stop))
    };
    let target = echo_target().await;
    let (_, _exit) = start(format!(
        "[client.services.ssh]\ntarget = \"{target}\"\np2p = true\ntoken = \"{SSH_TOKEN}\"\n"
    ));
    let ssh: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (admin, _entrance) = start(format!(
        "[client.services.ssh]\nbind = \"{ssh}\"\np2p = true\ntoken = \"{SSH_TOKEN}\"\n"
    ));
    service_when(admin, "ssh", |s| s["state"] == "direct").await;
    check_tcp(ssh, 2).await;
}
