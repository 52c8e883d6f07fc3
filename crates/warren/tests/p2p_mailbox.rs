//! The peer-to-peer mailbox end to end (issue 17), in process: a server with
//! `[server.p2p]`, a sender and a receiver that meet at a nameplate and run the real PAKE
//! through it; wrong words fail on both sides and burn the nameplate after three tries; a
//! server without the section says how to enable it.

mod support;

use std::time::Duration;

use support::*;
use warren::config::HostPort;
use warren::crypto::secret::Secret;
use warren::p2p::code::{Code, Nameplate};
use warren::p2p::mailbox::{Mailbox, MailboxError, MailboxServer};
use warren::p2p::pake::{CertFingerprint, Outcome, Pake, PakeError, Role};
use warren::{Server, ServerConfig};
use warren_proto::message::MailboxEvent;

const WAIT: Duration = Duration::from_secs(10);

async fn server(p2p: bool) -> (MailboxServer, tokio_util::sync::CancellationToken) {
    let port = free_port();
    let section = if p2p {
        "[server.p2p]\nrate_per_minute = 100\n"
    } else {
        ""
    };
    let text = format!(
        "[server]\nbind = \"127.0.0.1:{port}\"\npsk = \"{PSK}\"\nheartbeat_interval = \"1s\"\n{section}"
    );
    let mut config = ServerConfig::from_toml_str(&text, "server.toml").expect("valid config");
    // The P2P UDP port defaults to the server port's number, which was only checked free
    // for TCP: let the system pick one.
    if let Some(p2p) = config.p2p.as_mut() {
        p2p.udp_bind.set_port(0);
    }
    let bound = Server::from_config(config).unwrap().bind().await.unwrap();
    assert_eq!(bound.p2p_udp_addr().is_some(), p2p);
    let stop = bound.shutdown_token();
    let target = MailboxServer {
        server: HostPort::from(bound.local_addr()),
        psk: Secret::new(PSK),
        quic: None,
        deadline: Duration::from_secs(5),
    };
    tokio::spawn(bound.run());
    (target, stop)
}

fn fingerprint(n: u8) -> CertFingerprint {
    CertFingerprint::from_bytes([n; 32])
}

/// Runs one side's PAKE through the mailbox until it has an outcome or fails.
async fn exchange(mailbox: &mut Mailbox, mut pake: Pake) -> Result<Outcome, PakeError> {
    loop {
        while let Some(message) = pake.poll_transmit() {
            mailbox.send(message).await.expect("mailbox send");
        }
        if let Some(outcome) = pake.outcome() {
            return Ok(outcome.clone());
        }
        let body = match mailbox.next(WAIT).await.expect("a mailbox event") {
            MailboxEvent::Message { body } => body,
            MailboxEvent::PeerJoined => continue,
            other => panic!("unexpected {other:?}"),
        };
        if let Err(error) = pake.handle_message(&body) {
            // Our own Confirm may still be queued: the peer needs it to fail cleanly.
            while let Some(message) = pake.poll_transmit() {
                let _ = mailbox.send(message).await;
            }
            return Err(error);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_and_a_receiver_meet_at_a_nameplate_and_agree_on_each_others_certificate() {
    let (target, _stop) = server(true).await;
    let mut sender = Mailbox::connect(&target).await.unwrap();
    let (nameplate, udp_port) = sender.allocate().await.unwrap();
    assert!(
        udp_port.is_some_and(|port| port != 0),
        "the mailbox tells the UDP port"
    );
    let code = Code::generate(Nameplate::new(nameplate).unwrap(), &mut rand::rng());
    // The receiver types the code (the sender's PAKE message waits for it meanwhile).
    let typed = Code::parse(&code.reveal()).unwrap();
    let sending = tokio::spawn(async move {
        let pake = Pake::new(Role::Sender, &code, fingerprint(1), rand::random());
        let outcome = exchange(&mut sender, pake).await;
        sender.close().await;
        outcome
    });
    let mut receiver = Mailbox::connect(&target).await.unwrap();
    let claimed_port = receiver.claim(typed.nameplate().get()).await.unwrap();
    assert_eq!(claimed_port, udp_port, "both sides hear the same UDP port");
    let pake = Pake::new(Role::Receiver, &typed, fingerprint(2), rand::random());
    let received = exchange(&mut receiver, pake)
        .await
        .expect("the receiver agrees");
    let sent = sending.await.unwrap().expect("the sender agrees");
    assert!(sent.peer_fingerprint.matches(&fingerprint(2)));
    assert!(received.peer_fingerprint.matches(&fingerprint(1)));
    assert_eq!(sent.relay_key.expose(), received.relay_key.expose());
    // Both can now sign and verify each other's connectivity checks.
    let ours = warren::p2p::net::key::CheckKey::new(*sent.check_key.expose());
    let theirs = warren::p2p::net::key::CheckKey::new(*received.check_key.expose());
    assert_eq!(ours.sign(b"a check"), theirs.sign(b"a check"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_words_fail_on_both_sides_and_three_of_them_burn_the_nameplate() {
    let (target, _stop) = server(true).await;
    let mut sender = Mailbox::connect(&target).await.unwrap();
    let (nameplate, _) = sender.allocate().await.unwrap();
    let code = Code::generate(Nameplate::new(nameplate).unwrap(), &mut rand::rng());
    for attempt in 0..3u8 {
        // A guesser with the right number and other words.
        let wrong = Code::generate(Nameplate::new(nameplate).unwrap(), &mut rand::rng());
        let mut guesser = Mailbox::connect(&target).await.unwrap();
        guesser.claim(nameplate).await.unwrap();
        let guess = Pake::new(Role::Receiver, &wrong, fingerprint(9), rand::random());
        let real = Pake::new(Role::Sender, &code, fingerprint(1), rand::random());
        let (guessed, answered) =
            tokio::join!(exchange(&mut guesser, guess), exchange(&mut sender, real));
        assert!(guessed.is_err(), "attempt {attempt}: the guesser failed");
        assert!(answered.is_err(), "attempt {attempt}: the sender noticed");
        guesser.release(true).await.unwrap();
        if attempt < 2 {
            assert!(matches!(
                sender.next(WAIT).await,
                Ok(MailboxEvent::PeerLeft)
            ));
        }
    }
    assert!(matches!(sender.next(WAIT).await, Err(MailboxError::Burned)));
    // The number is free again, and nobody can claim the burned nameplate.
    let mut late = Mailbox::connect(&target).await.unwrap();
    let refused = late.claim(nameplate).await.unwrap_err();
    assert!(
        refused.to_string().contains("no code starts with"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_section_says_how_to_enable_it() {
    let (target, _stop) = server(false).await;
    let mut sender = Mailbox::connect(&target).await.unwrap();
    let error = sender.allocate().await.unwrap_err();
    assert!(error.to_string().contains("[server.p2p]"), "{error}");
}
