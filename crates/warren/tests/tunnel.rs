//! Integration tests: an in-process server and client on 127.0.0.1 (port 0) carry real
//! bytes, checked by hash.

mod support;

use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use warren::config::Transport;
use warren::{CipherSuite, ClientError};

#[tokio::test]
async fn bytes_arrive_exactly_in_both_directions_with_half_close() {
    let (target, mut results) = sink_then_reply_target(3 * 1024 * 1024 + 7).await;
    let (server, _client) = tunnel(&Setup::default(), target).await;
    let payload = random_bytes(5 * 1024 * 1024 + 13);
    // The target only answers after it saw our FIN: this checks half-close both ways.
    let reply = round_trip(server.service, &payload).await.unwrap();
    let (received_hash, sent) = results.recv().await.unwrap();
    assert_eq!(
        received_hash,
        hash(&payload),
        "visitor -> target bytes differ"
    );
    assert_eq!(hash(&reply), hash(&sent), "target -> visitor bytes differ");
}

#[tokio::test]
async fn every_cipher_carries_bytes() {
    let echo = echo_target().await;
    for cipher in CipherSuite::ENCRYPTING {
        let setup = Setup {
            client_ciphers: Some(vec![cipher]),
            ..Setup::default()
        };
        let (server, client) = tunnel(&setup, echo).await;
        assert_eq!(client.status.borrow().cipher, Some(cipher));
        let payload = random_bytes(1024 * 1024 + 1);
        let reply = round_trip(server.service, &payload).await.unwrap();
        assert_eq!(hash(&reply), hash(&payload), "{cipher}");
        client.stop.cancel();
        server.stop.cancel();
    }
}

#[tokio::test]
async fn client_preference_wins_among_allowed_ciphers_when_ordered() {
    let echo = echo_target().await;
    let setup = Setup {
        cipher_choice: Some(warren::CipherChoice::Ordered),
        server_ciphers: Some(vec![CipherSuite::Aes256Gcm, CipherSuite::ChaCha20Poly1305]),
        client_ciphers: Some(vec![
            CipherSuite::Aegis256,
            CipherSuite::ChaCha20Poly1305,
            CipherSuite::Aes256Gcm,
        ]),
        ..Setup::default()
    };
    let (_server, client) = tunnel(&setup, echo).await;
    assert_eq!(
        client.status.borrow().cipher,
        Some(CipherSuite::ChaCha20Poly1305)
    );
}

#[tokio::test]
async fn many_concurrent_visitors() {
    let echo = echo_target().await;
    let (server, _client) = tunnel(&Setup::default(), echo).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64 {
        let service = server.service;
        tasks.spawn(async move {
            let payload = random_bytes(64 * 1024 + i * 997);
            let reply = round_trip(service, &payload).await.unwrap();
            assert_eq!(hash(&reply), hash(&payload));
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

#[tokio::test]
async fn plaintext_transport_needs_insecure_and_then_works() {
    let refused = warren::Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .psk(PSK)
        .default_token(TOKEN)
        .transport(Transport::Tcp)
        .tcp_service("web", "127.0.0.1:0".parse().unwrap())
        .build();
    let errors = refused.unwrap_err().to_string();
    assert!(errors.contains("insecure"), "{errors}");

    let setup = Setup {
        transport: Transport::Tcp,
        insecure: true,
        ..Setup::default()
    };
    let echo = echo_target().await;
    let (server, client) = tunnel(&setup, echo).await;
    assert_eq!(client.status.borrow().cipher, Some(CipherSuite::None));
    let payload = random_bytes(2 * 1024 * 1024);
    assert_eq!(
        hash(&round_trip(server.service, &payload).await.unwrap()),
        hash(&payload)
    );
}

#[tokio::test]
async fn mismatched_transports_are_refused_with_a_clear_error() {
    let echo = echo_target().await;
    let server_setup = Setup {
        transport: Transport::Tcp,
        insecure: true,
        ..Setup::default()
    };
    let server = start_server(
        &server_setup,
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;
    let client = start_client(&Setup::default(), server.addr, echo);
    let result = tokio::time::timeout(Duration::from_secs(10), client.task)
        .await
        .unwrap()
        .unwrap();
    let error = result.unwrap_err();
    assert!(matches!(error, ClientError::Refused(_)), "{error}");
    assert!(error.to_string().contains("no common cipher"), "{error}");
}

#[tokio::test]
async fn wrong_psk_gets_no_answer_and_no_session() {
    let echo = echo_target().await;
    let server = start_server(
        &Setup::default(),
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;

    // A real client with the wrong PSK never gets a session.
    let setup = Setup {
        client_psk: "another-psk-0123456789-xyz".into(),
        ..Setup::default()
    };
    let client = start_client(&setup, server.addr, echo);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(client.status.borrow().sessions, 0);

    // On the wire: a handshake under a wrong PSK gets not one byte back.
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let (_, first) =
        warren_proto::handshake::ClientHandshake::start(&[42; 32], &[CipherSuite::Aes128Gcm])
            .unwrap();
    stream.write_all(&first).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "server answered an unauthenticated handshake");
}

#[tokio::test]
async fn wrong_token_is_refused_and_the_client_stops() {
    let echo = echo_target().await;
    let setup = Setup {
        client_token: "not-the-right-token-0123456".into(),
        ..Setup::default()
    };
    let server = start_server(
        &setup,
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;
    let client = start_client(&setup, server.addr, echo);
    let result = tokio::time::timeout(Duration::from_secs(10), client.task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(result, Err(ClientError::AllServicesRefused(_))),
        "{result:?}"
    );
}

#[tokio::test]
async fn visitor_without_a_client_is_closed_at_once() {
    let server = start_server(
        &Setup::default(),
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;
    let mut visitor = TcpStream::connect(server.service).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(1), visitor.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "visitor was not closed at once: {read:?}"
    );
}

#[tokio::test]
async fn dead_target_resets_the_visitor() {
    // A port with nothing listening.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (server, _client) = tunnel(&Setup::default(), dead).await;
    let result = round_trip(server.service, b"hello").await;
    assert!(
        result.is_err(),
        "visitor of a dead target must see an error, got {result:?}"
    );
}

#[tokio::test]
async fn a_cut_tunnel_reaches_the_visitor_as_a_reset_not_an_eof() {
    let plaintext = Setup {
        transport: Transport::Tcp,
        insecure: true,
        ..Setup::default()
    };
    for setup in [Setup::default(), plaintext] {
        cut_tunnel_resets_visitor(&setup).await;
    }
}

async fn cut_tunnel_resets_visitor(setup: &Setup) {
    // The target sends a lot and never finishes; then the client dies mid-stream.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let chunk = random_bytes(64 * 1024);
        while stream.write_all(&chunk).await.is_ok() {}
    });
    let (server, client) = tunnel(setup, target).await;
    let mut visitor = TcpStream::connect(server.service).await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0;
    while total < 1024 * 1024 {
        total += visitor.read(&mut buf).await.unwrap();
    }
    client.stop.cancel();
    let outcome = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match visitor.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(_) => continue,
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("visitor notices the cut within 10s");
    let error = outcome.expect_err("a cut stream must not end with a clean EOF");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
}

#[tokio::test]
async fn client_reconnects_after_a_server_restart() {
    let echo = echo_target().await;
    let setup = Setup::default();
    let server = start_server(
        &setup,
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;
    let (addr, service) = (server.addr, server.service);
    let mut client = start_client(&setup, addr, echo);
    client.wait_sessions(1).await;
    let payload = random_bytes(300_000);
    assert_eq!(
        hash(&round_trip(service, &payload).await.unwrap()),
        hash(&payload)
    );

    server.stop.cancel();
    server.task.await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        client.status.wait_for(|s| !s.connected),
    )
    .await
    .unwrap()
    .unwrap();

    let _again = start_server(&setup, addr, service).await;
    client.wait_sessions(2).await;
    assert_eq!(
        hash(&round_trip(service, &payload).await.unwrap()),
        hash(&payload)
    );
}

#[tokio::test]
async fn everything_works_over_ipv6_loopback() {
    let listener = match tokio::net::TcpListener::bind("[::1]:0").await {
        Ok(listener) => listener,
        Err(e) => panic!("IPv6 loopback is unavailable on this machine: {e}"),
    };
    let target = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    let setup = Setup::default();
    let server = start_server(
        &setup,
        "[::1]:0".parse().unwrap(),
        "[::1]:0".parse().unwrap(),
    )
    .await;
    assert!(server.addr.is_ipv6() && server.service.is_ipv6());
    let mut client = start_client(&setup, server.addr, target);
    client.wait_sessions(1).await;
    let payload = random_bytes(1024 * 1024);
    assert_eq!(
        hash(&round_trip(server.service, &payload).await.unwrap()),
        hash(&payload)
    );
}

#[tokio::test]
async fn channels_reused_across_many_sequential_streams_keep_bytes_exact() {
    // Streams that end cleanly hand their data channel back to the pool at both ends; the
    // next stream on it continues the record sequence. Bytes must stay exact across reuse.
    let (target, mut results) = sink_then_reply_target(40_000).await;
    let (server, _client) = tunnel(&Setup::default(), target).await;
    for i in 0..120 {
        let payload = random_bytes(1 + i * 1013);
        let reply = round_trip(server.service, &payload).await.unwrap();
        let (received_hash, sent) = results.recv().await.unwrap();
        assert_eq!(
            received_hash,
            hash(&payload),
            "stream {i}: visitor -> target"
        );
        assert_eq!(hash(&reply), hash(&sent), "stream {i}: target -> visitor");
    }
}

#[tokio::test]
async fn aborted_streams_do_not_poison_the_pool() {
    let echo = echo_target().await;
    let (server, _client) = tunnel(&Setup::default(), echo).await;
    for i in 0..40 {
        if i % 2 == 1 {
            // A visitor that gives up mid-stream with a reset: its channel must not be reused.
            let visitor = TcpStream::connect(server.service).await.unwrap();
            let mut visitor = visitor;
            visitor.write_all(&random_bytes(10_000)).await.unwrap();
            socket2::SockRef::from(&visitor)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
            drop(visitor);
            continue;
        }
        let payload = random_bytes(50_000 + i * 10);
        let reply = round_trip(server.service, &payload).await.unwrap();
        assert_eq!(hash(&reply), hash(&payload), "stream {i}");
    }
}

#[tokio::test]
async fn plaintext_path_keeps_bytes_exact_with_half_close_and_reuse() {
    // The plaintext transport: exact bytes, half-close both ways, large and tiny streams,
    // and channel reuse on that path.
    let setup = Setup {
        transport: Transport::Tcp,
        insecure: true,
        ..Setup::default()
    };
    let (target, mut results) = sink_then_reply_target(2 * 1024 * 1024 + 3).await;
    let (server, client) = tunnel(&setup, target).await;
    assert_eq!(client.status.borrow().cipher, Some(CipherSuite::None));
    for (i, len) in [0, 1, 7, 65_536, 65_537, 3 * 1024 * 1024 + 11, 100]
        .into_iter()
        .enumerate()
    {
        let payload = random_bytes(len);
        let reply = round_trip(server.service, &payload).await.unwrap();
        let (received_hash, sent) = results.recv().await.unwrap();
        assert_eq!(
            received_hash,
            hash(&payload),
            "stream {i} ({len} B): visitor -> target"
        );
        assert_eq!(hash(&reply), hash(&sent), "stream {i}: target -> visitor");
    }
}

#[tokio::test]
async fn server_speaks_first_protocols_work() {
    // SMTP/SSH style: the target talks before the visitor sends a byte. The stream must
    // open without waiting for visitor data (the server stages its StreamOpen to share a
    // segment with the visitor's first bytes, and must not hold it back forever).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                stream
                    .write_all(b"220 warren test ready\r\n")
                    .await
                    .unwrap();
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    let plaintext = Setup {
        transport: Transport::Tcp,
        insecure: true,
        ..Setup::default()
    };
    for setup in [Setup::default(), plaintext] {
        let (server, _client) = tunnel(&setup, target).await;
        for _ in 0..3 {
            let mut visitor = TcpStream::connect(server.service).await.unwrap();
            let mut greeting = [0u8; 23];
            tokio::time::timeout(Duration::from_secs(5), visitor.read_exact(&mut greeting))
                .await
                .expect("the greeting arrives without the visitor speaking first")
                .unwrap();
            assert_eq!(&greeting, b"220 warren test ready\r\n");
            let payload = random_bytes(100_000);
            visitor.write_all(&payload).await.unwrap();
            visitor.shutdown().await.unwrap();
            let mut echoed = Vec::new();
            visitor.read_to_end(&mut echoed).await.unwrap();
            assert_eq!(hash(&echoed), hash(&payload));
        }
    }
}

#[tokio::test]
async fn after_a_burst_larger_than_the_pools_every_visitor_is_served() {
    // A burst of concurrent visitors grows the channel pools past what either side keeps
    // afterwards (client 128, server 64); every later visitor must still be served. (The
    // rare case where the client drops a channel the server kept, about 1 in 2000 connects
    // in the benchmark before the client's "idle again" notice existed, is not forced here.)
    let echo = echo_target().await;
    let (server, _client) = tunnel(&Setup::default(), echo).await;
    let mut held = Vec::new();
    for _ in 0..200 {
        let mut visitor = TcpStream::connect(server.service).await.unwrap();
        visitor.write_all(b"h").await.unwrap();
        let mut one = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(10), visitor.read_exact(&mut one))
            .await
            .expect("burst visitor served")
            .unwrap();
        held.push(visitor);
    }
    for mut visitor in held {
        visitor.shutdown().await.unwrap();
        let mut rest = Vec::new();
        visitor.read_to_end(&mut rest).await.unwrap();
    }
    for i in 0..300 {
        let payload = random_bytes(1 + i % 50);
        let reply = round_trip(server.service, &payload)
            .await
            .unwrap_or_else(|e| panic!("visitor {i}: {e}"));
        assert_eq!(reply, payload, "visitor {i}");
    }
}
