//! The QUIC transport end to end, in process: a server and a client on 127.0.0.1 with
//! `transport = "quic"` carry real bytes (checked by hash) for reverse, forward and UDP
//! services; a wrong PSK gets no session.

mod support;

use std::time::Duration;

use support::*;
use tokio::net::UdpSocket;
use warren::config::Transport;

fn quic() -> Setup {
    Setup {
        transport: Transport::Quic,
        ..Setup::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_arrive_exactly_in_both_directions_with_half_close() {
    let (target, mut results) = sink_then_reply_target(3 * 1024 * 1024 + 7).await;
    let (server, client) = tunnel(&quic(), target).await;
    assert_eq!(
        client.status.borrow().cipher,
        None,
        "TLS encrypts, not a record cipher"
    );
    let payload = random_bytes(5 * 1024 * 1024 + 13);
    let reply = round_trip(server.service, &payload).await.unwrap();
    let (received_hash, sent) = results.recv().await.unwrap();
    assert_eq!(
        received_hash,
        hash(&payload),
        "visitor -> target bytes differ"
    );
    assert_eq!(hash(&reply), hash(&sent), "target -> visitor bytes differ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_visitors_each_get_their_own_bytes() {
    let echo = echo_target().await;
    let (server, _client) = tunnel(&quic(), echo).await;
    // Payloads made up front: generating megabytes of random bytes in a debug build would
    // starve the tunnel's own tasks (heartbeats) in the test's runtime.
    let payloads: Vec<Vec<u8>> = (0..200).map(|i| random_bytes(8 * 1024 + i * 101)).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for payload in payloads {
        let service = server.service;
        tasks.spawn(async move {
            let reply = round_trip(service, &payload).await.unwrap();
            assert_eq!(hash(&reply), hash(&payload));
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_psk_gets_no_session() {
    let echo = echo_target().await;
    let setup = Setup {
        client_psk: "a-different-psk-of-enough-length".into(),
        ..quic()
    };
    let server = start_server(
        &setup,
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;
    let client = start_client(&setup, server.addr, echo);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !client.status.borrow().connected,
        "a wrong PSK must not connect"
    );
    assert!(
        round_trip(server.service, b"hello")
            .await
            .map(|r| r.is_empty())
            .unwrap_or(true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_services_carry_datagrams_small_and_fragmented() {
    // A UDP echo target.
    let target = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let target_addr = target.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 70_000];
        while let Ok((n, from)) = target.recv_from(&mut buf).await {
            let _ = target.send_to(&buf[..n], from).await;
        }
    });
    let server = warren::Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .psk(PSK)
        .default_token(TOKEN)
        .transport(Transport::Quic)
        .quic(quic_config())
        .udp_service("dns", "127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap()
        .bind()
        .await
        .unwrap();
    let server_addr = server.local_addr();
    let service = server.service_addr("dns").unwrap();
    let stop = server.shutdown_token();
    tokio::spawn(server.run());
    let client = warren::Client::builder(warren::HostPort::from(server_addr))
        .psk(PSK)
        .default_token(TOKEN)
        .transport(Transport::Quic)
        .quic(quic_config())
        .udp_service("dns", warren::HostPort::from(target_addr))
        .build()
        .unwrap();
    let mut status = client.status();
    let client_stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(client.run(client_stop.clone()));
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.connected))
        .await
        .unwrap()
        .unwrap();
    let visitor = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut buf = vec![0u8; 70_000];
    for len in [1, 100, 1400, 9000, 30_000, 65_507] {
        let payload = random_bytes(len);
        // UDP may lose a datagram: a few tries each.
        let mut echoed = None;
        for _ in 0..5 {
            visitor.send_to(&payload, service).await.unwrap();
            if let Ok(Ok((n, _))) =
                tokio::time::timeout(Duration::from_secs(1), visitor.recv_from(&mut buf)).await
            {
                echoed = Some(buf[..n].to_vec());
                break;
            }
        }
        let echoed = echoed.unwrap_or_else(|| panic!("no echo of a {len}-byte datagram"));
        assert_eq!(hash(&echoed), hash(&payload), "{len}-byte datagram");
    }
    client_stop.cancel();
    stop.cancel();
}

/// Migration: the client's UDP socket changes (a new source port, as after a NAT
/// rebinding) in the middle of a transfer; the session and the stream carry on, and the
/// bytes arrive exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_the_client_moving_to_a_new_socket() {
    use std::sync::Arc;

    use warren::crypto::secret::Secret;
    use warren::session::link::{Carrier, ClientLink, Replenish, ServerLink, StreamHandler};
    use warren::session::quic::QuicLink;
    use warren::session::stream::{Chunk, Stream};
    use warren::transport::quic::{self as q, ClientTls, QuicSettings, ServerTls, certs};
    use warren_proto::message::StreamOpen;

    /// Echoes every stream it is handed, to the end.
    struct Echo;
    impl StreamHandler for Echo {
        async fn serve(&self, _: StreamOpen, mut stream: Stream, _: Replenish) -> Option<Stream> {
            loop {
                let bytes = match stream.reader.read().await {
                    Ok(Chunk::Data(bytes)) => bytes.to_vec(),
                    Ok(Chunk::End) => break,
                    _ => return None,
                };
                if stream.writer.send(&bytes).await.is_err() {
                    return None;
                }
            }
            let _ = stream.writer.finish().await;
            Some(stream)
        }
    }

    let psk = Secret::new(PSK);
    let cert = certs::self_signed(&["warren".to_owned()]).unwrap();
    let tls = ServerTls::psk(
        cert.cert_der.clone(),
        cert.private_key().unwrap(),
        psk.clone(),
    )
    .unwrap();
    let settings = QuicSettings::internet();
    let server_end = q::server_endpoint("127.0.0.1:0".parse().unwrap(), &tls, &settings).unwrap();
    let client_end = q::client_endpoint("127.0.0.1:0".parse().unwrap(), &settings).unwrap();
    let server_addr = server_end.endpoint.local_addr().unwrap();
    let accepting = async {
        let incoming = server_end.endpoint.accept().await.unwrap();
        q::accept(
            server_end.admit(incoming).unwrap(),
            &tls,
            Duration::from_secs(10),
        )
        .await
        .unwrap()
    };
    let client_tls = ClientTls::psk(psk, None).unwrap();
    let connecting = q::connect(
        &client_end,
        server_addr,
        "warren",
        &client_tls,
        Duration::from_secs(10),
    );
    let (server, client) = tokio::join!(accepting, connecting);
    let client = client.unwrap();
    let tasks = tokio_util::task::TaskTracker::new();
    let (control, _) = tokio::sync::mpsc::channel(1);
    let server_link = ServerLink::new(
        Carrier::Quic(server.connection.clone()),
        control,
        tokio_util::sync::CancellationToken::new(),
        tasks.clone(),
    );
    let client_link = ClientLink::Quic(QuicLink::new(client.connection.clone(), tasks.clone()));
    client_link.serve(&Arc::new(Echo));

    let payload = random_bytes(24 * 1024 * 1024);
    let open = StreamOpen {
        service: "web".into(),
        visitor: None,
        local: None,
    };
    let stream = server_link.open_stream(&open).await.unwrap();
    let before = server.connection.remote_address();
    let Stream {
        mut reader,
        mut writer,
    } = stream;
    let sending = async {
        for (n, chunk) in payload.chunks(256 * 1024).enumerate() {
            writer.send(chunk).await.unwrap();
            if n == 16 {
                // A third of the way in: the client's socket changes under the connection.
                let moved = client_end.rebind("127.0.0.1:0".parse().unwrap()).unwrap();
                assert_ne!(moved.local_addr.port(), before.port());
            }
        }
        writer.finish().await.unwrap();
    };
    let receiving = async {
        let mut got = Vec::with_capacity(payload.len());
        loop {
            match reader.read().await.unwrap() {
                Chunk::Data(bytes) => got.extend_from_slice(bytes),
                Chunk::End => return got,
                Chunk::Reset(reason) => panic!("reset: {reason}"),
            }
        }
    };
    let (_, echoed) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(sending, receiving)
    })
    .await
    .expect("the transfer finishes after the move");
    assert_eq!(hash(&echoed), hash(&payload));
    let after = server.connection.remote_address();
    assert_ne!(before, after, "the server sees the client's new address");
}

/// Hostile input on the server's UDP port: garbage datagrams of every size before and
/// while a real client connects; the client gets its session and carries bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_udp_port_does_not_stop_a_real_client() {
    let echo = echo_target().await;
    let server = start_server(
        &quic(),
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;
    let attacker = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let blast = |count: usize| {
        let attacker = &attacker;
        let target = server.addr;
        async move {
            for n in 0..count {
                // Random bytes, some shaped like long-header (Initial) packets.
                let mut junk = random_bytes(1 + (n * 37) % 1400);
                if n % 3 == 0 {
                    junk[0] = 0xc0 | (junk[0] & 0x0f);
                }
                let _ = attacker.send_to(&junk, target).await;
            }
        }
    };
    blast(5_000).await;
    let mut client = start_client(&quic(), server.addr, echo);
    let (_, ()) = tokio::join!(blast(5_000), client.wait_sessions(1));
    let payload = random_bytes(256 * 1024);
    let reply = round_trip(server.service, &payload).await.unwrap();
    assert_eq!(hash(&reply), hash(&payload));
}

/// A reload that changes the PSK of a QUIC server: new connections must prove the new
/// PSK (the endpoint's TLS settings are swapped), and the session that proved the old one
/// is ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_psk_reload_over_quic_takes_the_new_psk_and_ends_the_old_session() {
    const NEW_PSK: &str = "the-new-psk-after-the-reload-0123";
    let echo = echo_target().await;
    let cert = match quic_config().auth {
        warren::config::quic::QuicAuth::Psk {
            cert: Some(cert), ..
        } => cert,
        _ => unreachable!("quic_config is psk mode with a cert path"),
    };
    let toml = |psk: &str, port: u16, web: u16| {
        format!(
            "[server]\nbind = \"127.0.0.1:{port}\"\ntransport = \"quic\"\npsk = \"{psk}\"\ndefault_token = \"{TOKEN}\"\nheartbeat_interval = \"1s\"\n[server.quic]\ncert = \"{}\"\nmax_packet = 6500\n[server.services.web]\nbind = \"127.0.0.1:{web}\"\n",
            cert.display()
        )
    };
    let web = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let web_port = web.local_addr().unwrap().port();
    drop(web);
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = udp.local_addr().unwrap().port();
    drop(udp);
    let config = warren::ServerConfig::from_toml_str(&toml(PSK, port, web_port), "s.toml").unwrap();
    let bound = warren::Server::from_config(config)
        .unwrap()
        .bind()
        .await
        .unwrap();
    let addr = bound.local_addr();
    let service = bound.service_addr("web").unwrap();
    let reloader = bound.reloader();
    let stop = bound.shutdown_token();
    tokio::spawn(bound.run());

    let mut old = start_client(&quic(), addr, echo);
    old.wait_sessions(1).await;
    let new_config =
        warren::ServerConfig::from_toml_str(&toml(NEW_PSK, port, web_port), "s.toml").unwrap();
    reloader.apply(new_config).await.expect("reload applies");
    // The old client's session ends; with the old PSK it cannot come back.
    tokio::time::timeout(
        Duration::from_secs(15),
        old.status.wait_for(|s| !s.connected),
    )
    .await
    .expect("the old session ends after the PSK changed")
    .unwrap();
    let setup = Setup {
        client_psk: NEW_PSK.into(),
        ..quic()
    };
    let mut new = start_client(&setup, addr, echo);
    new.wait_sessions(1).await;
    let payload = random_bytes(100_000);
    let reply = round_trip(service, &payload).await.unwrap();
    assert_eq!(hash(&reply), hash(&payload));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !old.status.borrow().connected,
        "the old PSK must not connect again"
    );
    stop.cancel();
}

/// `warren ping` and `warren doctor` over QUIC: a probe session that serves nothing, with
/// real timings, and a doctor report whose QUIC line names the path's facts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_and_doctor_speak_quic() {
    let echo = echo_target().await;
    let (server, _client) = tunnel(&quic(), echo).await;
    let target = warren::ping::PingTarget {
        server: warren::HostPort::from(server.addr),
        psk: warren::crypto::secret::Secret::new(PSK),
        ciphers: Vec::new(),
        cipher_choice: Default::default(),
        deadline: Duration::from_secs(5),
        quic: Some(quic_config()),
    };
    let probe = warren::ping::probe(&target, 1)
        .await
        .expect("ping over QUIC");
    assert_eq!(probe.cipher, "tls1.3-quic");
    assert!(probe.rtt > Duration::ZERO && probe.handshake > Duration::ZERO);

    let dir = std::env::temp_dir().join(format!("warren-quic-doctor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("client.toml");
    std::fs::write(
        &config,
        format!(
            "[client]\nserver = \"{}\"\ntransport = \"quic\"\npsk = \"{PSK}\"\ndefault_token = \"{TOKEN}\"\n[client.quic]\nmax_packet = 6500\n[client.services.web]\ntarget = \"{echo}\"\n",
            server.addr
        ),
    )
    .unwrap();
    let report = warren::doctor::diagnose(&config).await;
    let text = format!("{report:?}");
    assert!(!report.failed(), "doctor failed over QUIC: {text}");
    assert!(text.contains("QUIC path: rtt"), "no QUIC line: {text}");
    assert!(text.contains("accepted by the server"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reload that switches the transport between TCP and QUIC is refused as needing a
/// restart (the server port is TCP for one, UDP for the other); the running server keeps
/// its transport and its clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_between_tcp_and_quic_asks_for_a_restart() {
    let echo = echo_target().await;
    let cert = match quic_config().auth {
        warren::config::quic::QuicAuth::Psk {
            cert: Some(cert), ..
        } => cert,
        _ => unreachable!("quic_config is psk mode with a cert path"),
    };
    let (port, web) = (free_port(), free_port());
    let toml = |transport: &str| {
        let quic = if transport == "quic" {
            format!(
                "[server.quic]\ncert = \"{}\"\nmax_packet = 6500\n",
                cert.display()
            )
        } else {
            String::new()
        };
        format!(
            "[server]\nbind = \"127.0.0.1:{port}\"\ntransport = \"{transport}\"\npsk = \"{PSK}\"\ndefault_token = \"{TOKEN}\"\nheartbeat_interval = \"1s\"\n{quic}[server.services.web]\nbind = \"127.0.0.1:{web}\"\n"
        )
    };
    let config = warren::ServerConfig::from_toml_str(&toml("noise"), "s.toml").unwrap();
    let bound = warren::Server::from_config(config)
        .unwrap()
        .bind()
        .await
        .unwrap();
    let addr = bound.local_addr();
    let service = bound.service_addr("web").unwrap();
    let reloader = bound.reloader();
    let stop = bound.shutdown_token();
    tokio::spawn(bound.run());
    let mut client = start_client(&Setup::default(), addr, echo);
    client.wait_sessions(1).await;
    let summary = reloader
        .apply(warren::ServerConfig::from_toml_str(&toml("quic"), "s.toml").unwrap())
        .await
        .expect("the reload is taken, with what it could not apply");
    assert!(
        summary
            .needs_restart
            .iter()
            .any(|line| line.contains("transport noise -> quic")),
        "{summary:?}"
    );
    // The server still speaks TCP to its client.
    let payload = random_bytes(100_000);
    let reply = round_trip(service, &payload).await.unwrap();
    assert_eq!(hash(&reply), hash(&payload));
    assert!(client.status.borrow().connected);
    stop.cancel();
}
