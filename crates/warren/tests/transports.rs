//! The web-looking transports (issue 19), in process: `tls`, `ws` and `wss` carry a
//! reverse service (bytes hash checked both ways); the server port still takes `noise`
//! beside them; ordinary HTTP gets the decoy page; and a relay that terminates TLS with a
//! certificate of its own cannot pass a `tls` session on (the PSK proof is bound to the
//! TLS session), while `wss` through such a relay works, as through a CDN, with a cipher
//! of its own inside (and none when it reaches the server's TLS directly).

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use warren::config::Transport;
use warren::transport::layers::ClientLayers;
use warren::transport::tls::{TlsClient, TlsServer};
use warren::transport::wire::Wire;

async fn carries_a_reverse_service(transport: Transport) {
    let setup = Setup {
        transport,
        ..Setup::default()
    };
    let target = echo_target().await;
    let (server, client) = tunnel(&setup, target).await;
    let payload = random_bytes(2 << 20);
    let reply = tokio::time::timeout(
        Duration::from_secs(20),
        round_trip(server.service, &payload),
    )
    .await
    .expect("round trip in time")
    .expect("round trip");
    assert_eq!(hash(&reply), hash(&payload), "{transport}: bytes differ");
    // Several visitors at once: pooled data channels on the transport.
    let mut visitors = Vec::new();
    for _ in 0..8 {
        let payload = random_bytes(256 << 10);
        visitors.push(tokio::spawn(async move {
            let reply = round_trip(server.service, &payload).await.unwrap();
            assert_eq!(hash(&reply), hash(&payload));
        }));
    }
    for visitor in visitors {
        visitor.await.unwrap();
    }
    client.stop.cancel();
    server.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_carries_a_reverse_service() {
    carries_a_reverse_service(Transport::Tls).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_carries_a_reverse_service() {
    carries_a_reverse_service(Transport::Ws).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_carries_a_reverse_service() {
    carries_a_reverse_service(Transport::Wss).await;
}

/// One port, every TCP transport: a `wss` server takes `noise`, `tls` and `ws` clients too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wss_server_port_takes_every_tcp_transport() {
    let target = echo_target().await;
    let server_setup = Setup {
        transport: Transport::Wss,
        ..Setup::default()
    };
    let server = start_loopback_server(&server_setup).await;
    for transport in [Transport::Noise, Transport::Tls, Transport::Ws] {
        let setup = Setup {
            transport,
            ..Setup::default()
        };
        let mut client = start_client(&setup, server.addr, target);
        client.wait_sessions(1).await;
        let payload = random_bytes(300 << 10);
        let reply = round_trip(server.service, &payload).await.unwrap();
        assert_eq!(hash(&reply), hash(&payload), "{transport}");
        client.stop.cancel();
        let _ = client.task.await;
    }
    server.stop.cancel();
}

/// Ordinary HTTP on a `ws` server's port gets a plain page and nothing about Warren.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_on_the_server_port_gets_the_decoy_page() {
    let setup = Setup {
        transport: Transport::Ws,
        ..Setup::default()
    };
    let server = start_loopback_server(&setup).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("answered and closed")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(!answer.to_lowercase().contains("warren"), "{answer}");
    server.stop.cancel();
}

/// A relay that terminates TLS with its own certificate and opens TLS to `server`:
/// what a stolen or forged certificate allows. It passes the bytes inside unchanged.
async fn tls_terminating_relay(server: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let issued = warren::transport::quic::certs::self_signed(&["localhost".to_owned()]).unwrap();
    let key = issued.private_key().unwrap();
    let front = TlsServer::new(vec![issued.cert_der.clone()], key).unwrap();
    let back = TlsClient::new(None, None).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (front, back) = (front.clone(), back.clone());
            tokio::spawn(async move {
                let Ok(near) = front.accept(stream).await else {
                    return;
                };
                let Ok(far) = TcpStream::connect(server).await else {
                    return;
                };
                let Ok(far) = back.connect(far, "localhost").await else {
                    return;
                };
                let (r, w) = near.split();
                let mut near = Wire::tls(r, w);
                let (r, w) = far.split();
                let mut far = Wire::tls(r, w);
                let _ = tokio::io::copy_bidirectional(&mut near, &mut far).await;
            });
        }
    });
    addr
}

/// A probe session (no claims) on `transport` to `to`, offering `policy`.
async fn probe_session(
    transport: Transport,
    to: SocketAddr,
    policy: &warren_proto::CipherPolicy,
) -> Result<warren::client::establish::EstablishedSession, warren::client::establish::EstablishError>
{
    let layers = ClientLayers::new(
        transport,
        TlsClient::new(None, None).unwrap(),
        "localhost".to_owned(),
        ("localhost".to_owned(), "/warren".to_owned()),
    );
    let dial = async {
        let stream = TcpStream::connect(to).await?;
        layers.wrap(stream).await
    };
    warren::client::establish::establish(
        dial,
        "server",
        &warren::crypto::secret::Secret::new(PSK),
        policy,
        &[],
        warren_proto::message::HelloMode::Probe,
        Duration::from_secs(5),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_terminating_relay_cannot_pass_a_tls_session_on_but_carries_wss() {
    let target = echo_target().await;
    let server_setup = Setup {
        transport: Transport::Wss,
        ..Setup::default()
    };
    let server = start_loopback_server(&server_setup).await;
    let relay = tls_terminating_relay(server.addr).await;

    // `tls`: the handshake inside is bound to the client's TLS session with the relay,
    // which is not the relay's session with the server.
    let policy = warren_proto::CipherPolicy {
        suites: vec![warren::CipherSuite::None],
        choice: warren::CipherChoice::Ordered,
        speeds: Vec::new(),
    };
    // Straight to the server, the same session authenticates, with TLS as its only
    // encryption.
    let direct = probe_session(Transport::Tls, server.addr, &policy)
        .await
        .expect("a direct tls session");
    assert_eq!(direct.keys.cipher(), warren::CipherSuite::None);
    assert_eq!(direct.keys.cipher_label(), "tls1.3");
    warren::client::establish::goodbye(direct.channel, "test done").await;
    let refused = probe_session(Transport::Tls, relay, &policy).await;
    assert!(
        matches!(
            refused,
            Err(warren::client::establish::EstablishError::ClosedDuringHandshake { .. })
        ),
        "a relayed tls session must not authenticate: {refused:?}"
    );

    // `wss`: the client proves its TLS session. Straight to the server the proof
    // matches and TLS is the only encryption; through the relay (a CDN) it cannot match,
    // and the records inside keep a cipher of their own, end to end.
    let policy = warren_proto::CipherPolicy {
        suites: vec![warren::CipherSuite::Aes128Gcm],
        ..policy
    };
    for (to, expected) in [
        (server.addr, warren::CipherSuite::None),
        (relay, warren::CipherSuite::Aes128Gcm),
    ] {
        let session = probe_session(Transport::Wss, to, &policy)
            .await
            .expect("a wss session");
        assert_eq!(session.keys.cipher(), expected, "wss to {to}");
        assert_eq!(
            session.keys.is_on_tls(),
            expected == warren::CipherSuite::None
        );
        warren::client::establish::goodbye(session.channel, "test done").await;
    }

    // A whole `wss` client through the relay: its data channels are not bound either.
    let setup = Setup {
        transport: Transport::Wss,
        ..Setup::default()
    };
    let mut client = start_client(&setup, relay, target);
    client.wait_sessions(1).await;
    let payload = random_bytes(1 << 20);
    let reply = round_trip(server.service, &payload).await.unwrap();
    assert_eq!(hash(&reply), hash(&payload));
    client.stop.cancel();
    server.stop.cancel();
}
