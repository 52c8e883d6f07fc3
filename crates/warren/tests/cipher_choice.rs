//! Issue 20: the cipher picked by measured speed, with peers that differ.
//!
//! In-process servers and clients on 127.0.0.1, port 0: a client that pins one cipher, a
//! client that speaks the first protocol version (no figures, driven through the proto API),
//! both sides `fastest`, and a suite only newer peers know.

mod support;

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use warren::client::establish;
use warren::crypto::keys::{self, SessionKeys};
use warren::crypto::secret::Secret;
use warren::crypto::speed;
use warren::session::stream::Stream;
use warren::transport::{Channel, preamble};
use warren::{CipherChoice, CipherSuite, HostPort, Side};
use warren_proto::cipher::{self, CipherPolicy};
use warren_proto::handshake::ClientHandshake;
use warren_proto::message::ControlMessage;

use support::*;

const DEADLINE: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_client_that_pins_chacha20_still_connects_to_a_default_server() {
    let echo = echo_target().await;
    let setup = Setup {
        client_ciphers: Some(vec![CipherSuite::ChaCha20Poly1305]),
        ..Setup::default()
    };
    let (server, client) = tunnel(&setup, echo).await;
    assert_eq!(
        client.status.borrow().cipher,
        Some(CipherSuite::ChaCha20Poly1305)
    );
    let payload = random_bytes(512 * 1024);
    let reply = round_trip(server.service, &payload).await.unwrap();
    assert_eq!(hash(&reply), hash(&payload));
}

#[tokio::test]
async fn an_old_client_without_figures_gets_the_ordered_choice() {
    let server = start_server(
        &Setup::default(),
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;
    // Message 1 exactly as a client of the first protocol version sends it: a cipher list
    // in preference order and nothing after it. Under `fastest` with figures, AEGIS-128L
    // would beat ChaCha20-Poly1305 on any CPU with AES instructions; without figures the
    // client's order must decide, as it did before figures existed.
    let psk = keys::noise_psk(&Secret::new(PSK));
    let offer = [CipherSuite::ChaCha20Poly1305, CipherSuite::Aegis128L];
    let (handshake, first) = ClientHandshake::start(&psk, &offer).unwrap();
    let mut stream =
        warren::transport::wire::Wire::tcp(TcpStream::connect(server.addr).await.unwrap());
    stream.write_all(&first).await.unwrap();
    let reply = tokio::time::timeout(DEADLINE, preamble::read_frame(&mut stream))
        .await
        .expect("the server answers")
        .expect("a reply frame");
    let established = handshake.handle_reply(&reply).expect("accepted");
    assert_eq!(established.cipher, CipherSuite::ChaCha20Poly1305);
    assert_eq!(established.negotiation.decided_by, CipherChoice::Ordered);
    assert!(
        established.negotiation.server_speeds.is_empty(),
        "an old client gets no extension"
    );

    // And the session works: a probe hello and a ping on the control channel.
    let keys = SessionKeys::new(&established);
    let (sealer, opener) = keys.control_channel(Side::Client);
    let mut channel = Stream::tcp(Channel::new(stream, sealer, opener));
    warren::session::send_control(&mut channel, &ControlMessage::Hello { services: vec![] })
        .await
        .unwrap();
    let answer = tokio::time::timeout(DEADLINE, warren::session::recv_control(&mut channel))
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(answer, ControlMessage::HelloReply { ref verdicts } if verdicts.is_empty()),
        "{answer:?}"
    );
    establish::ping(&mut channel, 1, DEADLINE).await.unwrap();
}

/// A probe session (no claims) with `policy`, the way `warren ping` makes one.
async fn probe(server: std::net::SocketAddr, policy: &CipherPolicy) -> SessionKeys {
    let target = HostPort::from(server);
    let session = establish::establish(
        async {
            let stream = warren::transport::tcp::connect(&target, DEADLINE).await?;
            warren::transport::layers::ClientLayers::plain()
                .wrap(stream)
                .await
        },
        &target.to_string(),
        &Secret::new(PSK),
        policy,
        &[],
        warren_proto::message::HelloMode::Probe,
        DEADLINE,
    )
    .await
    .expect("session");
    establish::goodbye(session.channel, "test done").await;
    session.keys
}

#[tokio::test]
async fn both_sides_fastest_pick_the_best_slower_end_and_both_know_the_figures() {
    let server = start_server(
        &Setup::default(),
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;
    let defaults = CipherSuite::default_preference(warren::config::has_aes_hardware());
    let policy = speed::policy_measured(&defaults, CipherChoice::Fastest).await;
    assert_eq!(
        policy.speeds.len(),
        defaults.len(),
        "every default suite measured"
    );
    let keys = probe(server.addr, &policy).await;
    let negotiation = keys.negotiation();
    assert_eq!(negotiation.decided_by, CipherChoice::Fastest);
    assert_eq!(negotiation.client_speeds, policy.speeds);
    // Server and client are one process here, so the server's figures come from the same
    // cache: the choice must be what `choose` makes of them.
    assert_eq!(negotiation.server_speeds, policy.speeds);
    let expected = cipher::choose(&defaults, Some(&policy.speeds), &policy).unwrap();
    assert_eq!(keys.cipher(), expected.suite);
    assert!(
        keys.describe_choice().starts_with("fastest; client "),
        "{}",
        keys.describe_choice()
    );

    // The same client with `ordered`: its own order decides and it sends no figures.
    let ordered = speed::policy_measured(&defaults, CipherChoice::Ordered).await;
    let keys = probe(server.addr, &ordered).await;
    assert_eq!(keys.cipher(), defaults[0]);
    assert_eq!(keys.negotiation().decided_by, CipherChoice::Ordered);
    assert!(keys.negotiation().client_speeds.is_empty());
}

#[tokio::test]
async fn a_suite_only_newer_peers_know_is_negotiated_through_the_extension() {
    let echo = echo_target().await;
    let setup = Setup {
        client_ciphers: Some(vec![CipherSuite::Aegis128X2]),
        ..Setup::default()
    };
    let (server, client) = tunnel(&setup, echo).await;
    assert_eq!(client.status.borrow().cipher, Some(CipherSuite::Aegis128X2));
    let payload = random_bytes(1024 * 1024 + 3);
    let reply = round_trip(server.service, &payload).await.unwrap();
    assert_eq!(hash(&reply), hash(&payload));
}

#[tokio::test]
async fn an_ordered_server_follows_the_clients_order_even_with_figures() {
    let setup = Setup {
        cipher_choice: Some(CipherChoice::Ordered),
        ..Setup::default()
    };
    let server = start_server(
        &setup,
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;
    let offer = [CipherSuite::ChaCha20Poly1305, CipherSuite::Aegis128L];
    let policy = speed::policy_measured(&offer, CipherChoice::Fastest).await;
    let keys = probe(server.addr, &policy).await;
    assert_eq!(keys.cipher(), CipherSuite::ChaCha20Poly1305);
    assert_eq!(keys.negotiation().decided_by, CipherChoice::Ordered);
    assert!(
        keys.negotiation().server_speeds.is_empty(),
        "an ordered server measures nothing"
    );
}
