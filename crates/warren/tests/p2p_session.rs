//! From a join code to a transfer (issue 17, `p2p::session`), in process against a real
//! server with `[server.p2p]`: the direct path on loopback, and a receiver whose UDP
//! cannot reach the server, which relays over its TCP session while the sender stays on
//! UDP. Bytes are checked by hash.

mod support;

use std::time::Duration;

use rand::RngCore;
use support::*;
use warren::Server;
use warren::p2p::code::Code;
use warren::p2p::mailbox::MailboxServer;
use warren::p2p::session::{self, Offering, Options, Route};
use warren::p2p::transfer::{self, Events, Offer, ReceiveOptions, Sources};

async fn server() -> (MailboxServer, StopOnDrop) {
    let config = p2p_server_config("");
    let bound = Server::from_config(config).unwrap().bind().await.unwrap();
    let stop = StopOnDrop(bound.shutdown_token());
    let target = mailbox_target(bound.local_addr());
    tokio::spawn(bound.run());
    (target, stop)
}

fn yes(_: Offer) -> std::future::Ready<bool> {
    std::future::ready(true)
}

/// Sends a 3 MiB random file from `sender` options to `receiver` options; returns both
/// routes after checking the bytes.
async fn transfer(sender: Options, receiver: Options) -> (Route, Route) {
    let scratch = tempfile::tempdir().unwrap();
    let src = scratch.path().join("payload.bin");
    let mut bytes = vec![0u8; 3 * 1024 * 1024 + 11];
    rand::rng().fill_bytes(&mut bytes);
    std::fs::write(&src, &bytes).unwrap();
    let out = scratch.path().join("out");
    std::fs::create_dir(&out).unwrap();

    let mut offering = Offering::open(sender).await.expect("a code");
    let code = Code::parse(&offering.code().unwrap().reveal()).unwrap();
    let sources = Sources::walk(std::slice::from_ref(&src), &[]).unwrap();
    let sending = tokio::spawn(async move {
        let connected = offering.next_receiver().await.expect("the sender connects");
        transfer::send(&connected.connection, &sources, &Events::none())
            .await
            .expect("sent");
        connected.route
    });
    let connected = session::join(&code, &receiver)
        .await
        .expect("the receiver connects");
    transfer::receive(
        &connected.connection,
        &out,
        ReceiveOptions::default(),
        yes,
        &Events::none(),
    )
    .await
    .expect("received");
    let sent_route = tokio::time::timeout(Duration::from_secs(30), sending)
        .await
        .expect("the sender finishes")
        .unwrap();
    assert_eq!(
        blake3::hash(&std::fs::read(out.join("payload.bin")).unwrap()),
        blake3::hash(&bytes)
    );
    (sent_route, connected.route)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_peers_on_loopback_connect_directly() {
    let (target, _stop) = server().await;
    let (sent, received) = transfer(Options::new(target.clone()), Options::new(target)).await;
    assert!(matches!(sent, Route::Direct(_)), "{sent:?}");
    assert!(matches!(received, Route::Direct(_)), "{received:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_whose_udp_cannot_reach_the_server_relays_over_its_tcp_session() {
    let (target, _stop) = server().await;
    let mut receiver = Options::new(target.clone());
    // An IPv6 socket cannot send to the server's IPv4 UDP port: to this receiver, UDP to
    // the server is blocked (discovery gets no answer), while TCP works.
    receiver.bind = Some("[::1]:0".parse().unwrap());
    let (sent, received) = transfer(Options::new(target), receiver).await;
    assert!(matches!(sent, Route::Relayed(_)), "{sent:?}");
    assert!(matches!(received, Route::Relayed(_)), "{received:?}");
}
