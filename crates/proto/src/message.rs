//! Control messages and their codec.
//!
//! Every message after the handshake travels inside one sealed record of kind `Control`
//! (see `docs/protocol.md`), serialized with postcard. The record layer already bounds a
//! record to 64 KiB; [`decode`] additionally refuses anything over [`MAX_CONTROL_LEN`] before
//! looking at it, so a peer cannot make us build large values.
//!
//! Message flow on a control channel:
//!
//! ```text
//! client                                   server
//!   Hello { services + token proofs }  ->
//!                                       <-  HelloReply { one verdict per service }
//!                                       <-  Ping { seq }      (every heartbeat_interval)
//!   Pong { seq }                       ->
//!                                       <-  NeedChannels { count }  (pool ran dry)
//!   Goodbye { reason }                <->   (orderly shutdown, either side)
//! ```
//!
//! On a data channel the opener's first record is an [`StreamOpen`], then data records.

use serde::{Deserialize, Serialize};

/// Largest encoded control message we accept. Hellos with a few hundred services fit easily.
pub const MAX_CONTROL_LEN: usize = 16 * 1024;

/// Most services one client may claim in one hello: bounds the server's work per hello.
pub const MAX_SERVICES_PER_SESSION: usize = 256;

/// Longest service name, in bytes.
pub const MAX_SERVICE_NAME_LEN: usize = 64;

/// Length of a token proof (HMAC-SHA256).
pub const PROOF_LEN: usize = 32;

/// A client's claim to serve one service, proving it knows the service token without
/// sending it: `proof = HMAC-SHA256(token, "warren token proof" || handshake hash || name)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceClaim {
    /// The service name, as in both configs.
    pub name: String,
    /// The token proof, bound to this handshake so it cannot be replayed elsewhere.
    pub proof: [u8; PROOF_LEN],
}

/// The server's answer for one claimed service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// The service is now served by this session.
    Accepted,
    /// Unknown service or wrong token: deliberately the same answer for both.
    Refused,
}

/// Messages on the control channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ControlMessage {
    /// Client → server, first message: the services this client serves.
    Hello {
        /// One claim per service.
        services: Vec<ServiceClaim>,
    },
    /// Server → client: one verdict per claim, in the same order.
    HelloReply {
        /// Verdicts, index-aligned with the hello's claims.
        verdicts: Vec<Verdict>,
    },
    /// Liveness probe; the peer answers with `Pong` carrying the same `seq`.
    Ping {
        /// Echoed in the pong.
        seq: u64,
    },
    /// Answer to `Ping`.
    Pong {
        /// The ping's `seq`.
        seq: u64,
    },
    /// Server → client: open this many more data channels, the pool ran dry.
    NeedChannels {
        /// How many channels to add.
        count: u16,
    },
    /// Orderly end of the session.
    Goodbye {
        /// Why, for the peer's log.
        reason: String,
    },
}

/// First record on a data channel: which service this stream belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOpen {
    /// The service name.
    pub service: String,
}

/// Why bytes could not be decoded as a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The encoded message is larger than the protocol allows.
    #[error("control message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Length seen.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The bytes are not a valid message (corrupt, or a peer speaking another version).
    #[error("malformed control message: {0}")]
    Malformed(postcard::Error),
    /// A field is out of the protocol's bounds.
    #[error("control message field `{field}` out of bounds: {len} > {max}")]
    FieldTooLong {
        /// Which field.
        field: &'static str,
        /// Length seen.
        len: usize,
        /// Limit.
        max: usize,
    },
}

/// Encodes a message.
///
/// Encoding a value of our own types into a `Vec` cannot fail except by exhausting
/// memory, which aborts anyway; the `Result` is mapped for postcard's sake.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    // Invariant: postcard's `to_allocvec` only fails for types it cannot represent
    // (e.g. maps with unknown length), which none of our message types contain.
    postcard::to_allocvec(message).expect("control messages always serialize")
}

/// Decodes a control-channel message, checking the size cap first.
///
/// # Errors
/// [`DecodeError::TooLarge`] before reading anything when `bytes` exceeds
/// [`MAX_CONTROL_LEN`]; [`DecodeError::Malformed`] for bytes that are not a message;
/// [`DecodeError::FieldTooLong`] for too many services or too long names.
pub fn decode_control(bytes: &[u8]) -> Result<ControlMessage, DecodeError> {
    let message: ControlMessage = decode(bytes)?;
    if let ControlMessage::Hello { services } = &message {
        check_len("services", services.len(), MAX_SERVICES_PER_SESSION)?;
        for claim in services {
            check_len("service name", claim.name.len(), MAX_SERVICE_NAME_LEN)?;
        }
    }
    if let ControlMessage::Goodbye { reason } = &message {
        check_len("reason", reason.len(), 1024)?;
    }
    Ok(message)
}

/// Decodes the first record of a data channel.
///
/// # Errors
/// As [`decode_control`].
pub fn decode_stream_open(bytes: &[u8]) -> Result<StreamOpen, DecodeError> {
    let open: StreamOpen = decode(bytes)?;
    check_len("service name", open.service.len(), MAX_SERVICE_NAME_LEN)?;
    Ok(open)
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, DecodeError> {
    if bytes.len() > MAX_CONTROL_LEN {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            max: MAX_CONTROL_LEN,
        });
    }
    postcard::from_bytes(bytes).map_err(DecodeError::Malformed)
}

fn check_len(field: &'static str, len: usize, max: usize) -> Result<(), DecodeError> {
    if len > max {
        Err(DecodeError::FieldTooLong { field, len, max })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_message() -> impl Strategy<Value = ControlMessage> {
        let claim = ("[a-z0-9-]{1,64}", any::<[u8; 32]>())
            .prop_map(|(name, proof)| ServiceClaim { name, proof });
        prop_oneof![
            prop::collection::vec(claim, 0..20)
                .prop_map(|services| ControlMessage::Hello { services }),
            prop::collection::vec(
                prop_oneof![Just(Verdict::Accepted), Just(Verdict::Refused)],
                0..20
            )
            .prop_map(|verdicts| ControlMessage::HelloReply { verdicts }),
            any::<u64>().prop_map(|seq| ControlMessage::Ping { seq }),
            any::<u64>().prop_map(|seq| ControlMessage::Pong { seq }),
            any::<u16>().prop_map(|count| ControlMessage::NeedChannels { count }),
            ".{0,100}".prop_map(|reason| ControlMessage::Goodbye { reason }),
        ]
    }

    proptest! {
        #[test]
        fn control_round_trip(message in arb_message()) {
            prop_assert_eq!(decode_control(&encode(&message)), Ok(message));
        }

        #[test]
        fn stream_open_round_trip(service in "[a-z0-9_.-]{1,64}") {
            let open = StreamOpen { service };
            prop_assert_eq!(decode_stream_open(&encode(&open)), Ok(open));
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_control(&bytes);
            let _ = decode_stream_open(&bytes);
        }
    }

    #[test]
    fn oversized_is_refused_before_parsing() {
        let big = vec![0u8; MAX_CONTROL_LEN + 1];
        assert!(matches!(
            decode_control(&big),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn too_many_services_refused() {
        let services = (0..=MAX_SERVICES_PER_SESSION)
            .map(|i| ServiceClaim {
                name: format!("s{i}"),
                proof: [0; 32],
            })
            .collect();
        let bytes = encode(&ControlMessage::Hello { services });
        assert!(matches!(
            decode_control(&bytes),
            Err(DecodeError::FieldTooLong {
                field: "services",
                ..
            }) | Err(DecodeError::TooLarge { .. })
        ));
    }
}
