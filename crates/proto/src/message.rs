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
//!                                       <-  Reclaim { reason }  (claim again: config changed)
//!   Goodbye { reason }                <->   (orderly shutdown, either side)
//! ```
//!
//! On a data channel the opener's first record is an [`StreamOpen`], then data records.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Largest encoded control message we accept. Hellos with a few hundred services fit easily.
pub const MAX_CONTROL_LEN: usize = 16 * 1024;

/// Most services one client may claim in one hello: bounds the server's work per hello.
pub const MAX_SERVICES_PER_SESSION: usize = 256;

/// Longest service name, in bytes.
pub const MAX_SERVICE_NAME_LEN: usize = 64;

/// Length of a token proof (HMAC-SHA256).
pub const PROOF_LEN: usize = 32;

/// Longest `HOST:PORT` a forward claim may name as its target.
pub const MAX_TARGET_LEN: usize = 300;

/// Longest refusal reason in a [`Verdict::Denied`].
pub const MAX_REASON_LEN: usize = 1024;

/// A client's claim to serve one service, proving it knows the service token without
/// sending it: `proof = HMAC-SHA256(token, "warren token proof" || handshake hash || name)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceClaim {
    /// The service name, as in both configs.
    pub name: String,
    /// The token proof, bound to this handshake so it cannot be replayed elsewhere.
    pub proof: [u8; PROOF_LEN],
    /// Which way the service's streams go, as the client's config sees it.
    pub kind: ClaimKind,
}

/// What a client claims a service as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimKind {
    /// A service in the server's config that the server binds (visitors come to the server).
    Reverse,
    /// A forward service: the client binds, the server dials a target its config names.
    /// With `target`, the server picks its forward service whose target is exactly this
    /// `HOST:PORT` (the token proof is then checked against that service's token); without,
    /// it looks the service up by name.
    Forward {
        /// The target the client asks for, if it selects by target.
        target: Option<String>,
    },
    /// A service the server's config does not list (frp/bore style): the server binds
    /// `remote_bind` (port 0: any free port) if its `allow_ports` / `allow_bind_addrs` allow
    /// it; the proof is checked against the server's `default_token`.
    Declared {
        /// Where the client wants visitors to connect at the server.
        remote_bind: SocketAddr,
    },
    /// As [`ClaimKind::Forward`], for a UDP forward service: the client binds a UDP port and
    /// the server sends each flow's datagrams to the target. A separate variant (rather than
    /// a field) so the encodings of the TCP claims stay what they were.
    ForwardUdp {
        /// The target the client asks for, if it selects by target.
        target: Option<String>,
    },
    /// As [`ClaimKind::Declared`], for a UDP service: the server binds a UDP socket.
    DeclaredUdp {
        /// Where the client wants visitors to send datagrams at the server.
        remote_bind: SocketAddr,
    },
}

/// Which transport protocol a claimed service carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Streams.
    Tcp,
    /// Datagrams.
    Udp,
}

impl ClaimKind {
    /// The protocol the claim says the service carries; `None` for a reverse claim, whose
    /// protocol is whatever the server's config says.
    pub fn protocol(&self) -> Option<Protocol> {
        match self {
            ClaimKind::Reverse => None,
            ClaimKind::Forward { .. } | ClaimKind::Declared { .. } => Some(Protocol::Tcp),
            ClaimKind::ForwardUdp { .. } | ClaimKind::DeclaredUdp { .. } => Some(Protocol::Udp),
        }
    }
}

/// The server's answer for one claimed service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// The service is now served by this session.
    Accepted {
        /// For a declared service, the address the server bound (the real port when the
        /// client asked for port 0).
        bound: Option<SocketAddr>,
    },
    /// Unknown service or wrong token: deliberately the same answer for both.
    Refused,
    /// The token was right but the server cannot serve the claim; the reason says why
    /// (port outside `allow_ports`, port in use, wrong direction).
    Denied {
        /// For the client's log.
        reason: String,
    },
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
    /// Server → client: what this session was granted changed (the server's config was
    /// reloaded); establish a new session, claiming again, and then end this one. A server
    /// ends the session itself if the client does not within its grace period.
    ///
    /// Added after the first release, at the end of the enum: older peers' variants keep
    /// their postcard indices, and an older client that cannot decode it ends the session
    /// and reconnects, which comes to the same.
    Reclaim {
        /// Why, for the client's log.
        reason: String,
    },
}

/// First record on a data channel: which service this stream belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOpen {
    /// The service name.
    pub service: String,
    /// The visitor's address (source of the connection to the bound port), for the PROXY
    /// protocol header towards the target. `None` when unknown (UDP channels).
    pub visitor: Option<SocketAddr>,
    /// The address the visitor connected to (the bound port), the header's destination.
    pub local: Option<SocketAddr>,
}

impl StreamOpen {
    /// A stream open for `service` with no addresses.
    pub fn new(service: impl Into<String>) -> Self {
        StreamOpen {
            service: service.into(),
            visitor: None,
            local: None,
        }
    }
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
            if let ClaimKind::Forward {
                target: Some(target),
            }
            | ClaimKind::ForwardUdp {
                target: Some(target),
            } = &claim.kind
            {
                check_len("target", target.len(), MAX_TARGET_LEN)?;
            }
        }
    }
    if let ControlMessage::HelloReply { verdicts } = &message {
        check_len("verdicts", verdicts.len(), MAX_SERVICES_PER_SESSION)?;
        for verdict in verdicts {
            if let Verdict::Denied { reason } = verdict {
                check_len("reason", reason.len(), MAX_REASON_LEN)?;
            }
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
        let kind = prop_oneof![
            Just(ClaimKind::Reverse),
            proptest::option::of("[a-z0-9.:-]{1,40}")
                .prop_map(|target| ClaimKind::Forward { target }),
            (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| ClaimKind::Declared {
                remote_bind: SocketAddr::from((ip, port))
            }),
            proptest::option::of("[a-z0-9.:-]{1,40}")
                .prop_map(|target| ClaimKind::ForwardUdp { target }),
            (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, port)| ClaimKind::DeclaredUdp {
                remote_bind: SocketAddr::from((ip, port))
            }),
        ];
        let claim = ("[a-z0-9-]{1,64}", any::<[u8; 32]>(), kind)
            .prop_map(|(name, proof, kind)| ServiceClaim { name, proof, kind });
        let verdict = prop_oneof![
            Just(Verdict::Accepted { bound: None }),
            any::<u16>().prop_map(|port| Verdict::Accepted {
                bound: Some(SocketAddr::from(([127, 0, 0, 1], port)))
            }),
            Just(Verdict::Refused),
            ".{0,100}".prop_map(|reason| Verdict::Denied { reason }),
        ];
        prop_oneof![
            prop::collection::vec(claim, 0..20)
                .prop_map(|services| ControlMessage::Hello { services }),
            prop::collection::vec(verdict, 0..20)
                .prop_map(|verdicts| ControlMessage::HelloReply { verdicts }),
            any::<u64>().prop_map(|seq| ControlMessage::Ping { seq }),
            any::<u64>().prop_map(|seq| ControlMessage::Pong { seq }),
            any::<u16>().prop_map(|count| ControlMessage::NeedChannels { count }),
            ".{0,100}".prop_map(|reason| ControlMessage::Goodbye { reason }),
            ".{0,100}".prop_map(|reason| ControlMessage::Reclaim { reason }),
        ]
    }

    proptest! {
        #[test]
        fn control_round_trip(message in arb_message()) {
            prop_assert_eq!(decode_control(&encode(&message)), Ok(message));
        }

        #[test]
        fn stream_open_round_trip(service in "[a-z0-9_.-]{1,64}", port in any::<u16>()) {
            let open = StreamOpen {
                service,
                visitor: Some(SocketAddr::from(([127, 0, 0, 2], port))),
                local: Some("[::1]:8080".parse().expect("addr")),
            };
            prop_assert_eq!(decode_stream_open(&encode(&open)), Ok(open));
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_control(&bytes);
            let _ = decode_stream_open(&bytes);
        }
    }

    #[test]
    fn claim_kind_indices_are_stable() {
        // docs/protocol.md lists these indices; the UDP variants were appended so the
        // encodings of the older claims did not change.
        let addr = SocketAddr::from(([127, 0, 0, 1], 1));
        let index = |kind: ClaimKind| encode(&kind)[0];
        assert_eq!(index(ClaimKind::Reverse), 0);
        assert_eq!(index(ClaimKind::Forward { target: None }), 1);
        assert_eq!(index(ClaimKind::Declared { remote_bind: addr }), 2);
        assert_eq!(index(ClaimKind::ForwardUdp { target: None }), 3);
        assert_eq!(index(ClaimKind::DeclaredUdp { remote_bind: addr }), 4);
        assert_eq!(
            ClaimKind::DeclaredUdp { remote_bind: addr }.protocol(),
            Some(Protocol::Udp)
        );
        assert_eq!(ClaimKind::Reverse.protocol(), None);
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
                kind: ClaimKind::Reverse,
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
