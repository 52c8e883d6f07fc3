//! Round-trip property tests for every codec in `warren-proto` that `src/message.rs` does
//! not already cover: preamble frames, data channel hello and accept, the Noise payloads
//! (`ClientInit`, `ServerInit`, `Refusal`), cipher suites; and "garbage never panics" for
//! each decoder. The fuzz targets in `fuzz/` push the same decoders further.

use proptest::prelude::*;
use warren_proto::handshake::{
    self, ClientInit, DataAccept, DataHello, HandshakeError, Preamble, Refusal, ServerInit,
};
use warren_proto::message::{self, ControlMessage, StreamOpen};
use warren_proto::{CipherPolicy, CipherSuite};

fn arb_suite() -> impl Strategy<Value = CipherSuite> {
    prop_oneof![
        Just(CipherSuite::Aes256Gcm),
        Just(CipherSuite::Aes128Gcm),
        Just(CipherSuite::ChaCha20Poly1305),
        Just(CipherSuite::Aegis128L),
        Just(CipherSuite::Aegis256),
        Just(CipherSuite::None),
    ]
}

fn arb_refusal() -> impl Strategy<Value = Refusal> {
    prop_oneof![
        any::<u16>().prop_map(|server| Refusal::Version { server }),
        prop::collection::vec(arb_suite(), 0..6)
            .prop_map(|server_allows| Refusal::NoCommonCipher { server_allows }),
    ]
}

fn arb_server_init() -> impl Strategy<Value = ServerInit> {
    prop_oneof![
        (arb_suite(), any::<[u8; 16]>())
            .prop_map(|(cipher, session_id)| ServerInit::Accept { cipher, session_id }),
        arb_refusal().prop_map(ServerInit::Refuse),
    ]
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    postcard::from_bytes(bytes).ok()
}

proptest! {
    #[test]
    fn data_hello_round_trips_through_its_preamble_frame(
        session_id in any::<[u8; 16]>(),
        client_nonce in any::<[u8; 32]>(),
        mac in any::<[u8; 32]>(),
    ) {
        let hello = DataHello { session_id, client_nonce, mac };
        let frame = hello.to_frame();
        let len = handshake::frame_len([frame[0], frame[1]]).expect("valid length");
        prop_assert_eq!(len, frame.len() - 2);
        prop_assert_eq!(handshake::parse_preamble(&frame[2..]), Ok(Preamble::Data(hello)));
    }

    #[test]
    fn data_accept_round_trips(server_nonce in any::<[u8; 32]>(), mac in any::<[u8; 32]>()) {
        let accept = DataAccept { server_nonce, mac };
        let frame = accept.to_frame();
        let len = handshake::frame_len([frame[0], frame[1]]).expect("valid length");
        prop_assert_eq!(len, DataAccept::LEN);
        prop_assert_eq!(DataAccept::from_bytes(&frame[2..]), Ok(accept));
    }

    #[test]
    fn noise_payloads_round_trip(
        version in any::<u16>(),
        ciphers in prop::collection::vec(arb_suite(), 0..16),
        server_init in arb_server_init(),
    ) {
        let init = ClientInit { version, ciphers };
        prop_assert_eq!(decode::<ClientInit>(&message::encode(&init)), Some(init));
        prop_assert_eq!(decode::<ServerInit>(&message::encode(&server_init)), Some(server_init));
    }

    #[test]
    fn frame_len_accepts_exactly_1_to_max(prefix in any::<[u8; 2]>()) {
        let len = usize::from(u16::from_be_bytes(prefix));
        let ok = (1..=handshake::MAX_PREAMBLE_LEN).contains(&len);
        prop_assert_eq!(handshake::frame_len(prefix).is_ok(), ok);
    }

    #[test]
    fn decoders_never_panic_on_garbage(bytes in prop::collection::vec(any::<u8>(), 0..1200)) {
        let _ = handshake::parse_preamble(&bytes);
        let _ = DataHello::from_bytes(&bytes);
        let _ = DataAccept::from_bytes(&bytes);
        let _ = decode::<ClientInit>(&bytes);
        let _ = decode::<ServerInit>(&bytes);
        let _ = message::decode_control(&bytes);
        let _ = message::decode_stream_open(&bytes);
        // A stranger's message 1 is refused in silence.
        let refused = handshake::server_handshake(&[9; 32], &bytes, &CipherPolicy::ordered(vec![CipherSuite::Aes256Gcm]), [0; 16]);
        prop_assert!(matches!(
            refused,
            Err(HandshakeError::Unauthenticated | HandshakeError::Malformed)
        ));
    }

    #[test]
    fn hello_reply_and_goodbye_round_trip(reason in "\\PC{0,200}", seq in any::<u64>()) {
        for msg in [
            ControlMessage::Goodbye { reason: reason.clone() },
            ControlMessage::Ping { seq },
            ControlMessage::Pong { seq },
        ] {
            prop_assert_eq!(message::decode_control(&message::encode(&msg)), Ok(msg));
        }
        let open = StreamOpen { service: reason.chars().take(16).collect(), visitor: None, local: None };
        prop_assert_eq!(message::decode_stream_open(&message::encode(&open)), Ok(open));
    }
}

#[test]
fn preamble_length_prefixes_0_max_plus_1_and_u16_max_are_refused() {
    for prefix in [[0u8, 0], [0x04, 0x01], [0xff, 0xff]] {
        assert_eq!(handshake::frame_len(prefix), Err(HandshakeError::Malformed));
    }
    assert_eq!(handshake::frame_len([0x04, 0x00]), Ok(1024));
}

#[test]
fn a_full_handshake_round_trips_and_a_replayed_message_1_gives_other_keys() {
    let psk = [3u8; 32];
    let (client, frame) =
        handshake::ClientHandshake::start(&psk, &[CipherSuite::ChaCha20Poly1305]).expect("start");
    let body = &frame[3..];
    let outcome = handshake::server_handshake(
        &psk,
        body,
        &CipherPolicy::ordered(vec![CipherSuite::ChaCha20Poly1305]),
        [5; 16],
    )
    .expect("server");
    let server = outcome.result.expect("accepted");
    let established = client.handle_reply(&outcome.reply[2..]).expect("client");
    assert_eq!(established, server);
    // The replayed message 1 is answered (the server cannot tell), but the session keys
    // differ: the replayer learns nothing usable.
    let replay = handshake::server_handshake(
        &psk,
        body,
        &CipherPolicy::ordered(vec![CipherSuite::ChaCha20Poly1305]),
        [5; 16],
    )
    .expect("server")
    .result
    .expect("accepted");
    assert_ne!(replay.split, server.split);
}
