//! Establishing a session, step by step: TCP connect, Noise handshake, hello with token
//! proofs, verdicts. The client's run loop, `warren doctor` and `warren ping` all use
//! [`establish`], so the three can never disagree about how a session starts.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;
use warren_proto::CipherPolicy;
use warren_proto::handshake::{HandshakeError, Refusal};
use warren_proto::message::{
    self, ClaimKind, ControlMessage, HelloClaim, HelloMode, ReplyAssembler, ServiceClaim, Verdict,
};

use crate::Side;
use crate::client::quic::QuicClient;
use crate::crypto::keys::{self, SessionKeys};
use crate::crypto::secret::Secret;
use crate::session as control;
use crate::session::link::Carrier;
use crate::session::stream::Stream;
use crate::transport::Channel;
use crate::transport::layers::{ClientLayers, Connected};
use crate::transport::preamble::{self, PreambleError};
use crate::transport::quic::QuicError;

/// A session that is up: the control channel, its keys, and how long each step took.
pub struct EstablishedSession {
    /// The control channel, ready for [`control::run_control`].
    pub channel: Stream,
    /// What the session's streams run on.
    pub carrier: Carrier,
    /// The session's keys.
    pub keys: SessionKeys,
    /// The address the connection reached.
    pub server_addr: SocketAddr,
    /// One verdict per claim, in order (empty for a probe session).
    pub verdicts: Vec<Verdict>,
    /// TCP connect time (QUIC: 0, the handshake is the connect).
    pub connect_time: Duration,
    /// Noise or QUIC (TLS + PSK proof) handshake time.
    pub handshake_time: Duration,
    /// Hello round trip.
    pub hello_time: Duration,
}

impl std::fmt::Debug for EstablishedSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EstablishedSession")
            .field("server_addr", &self.server_addr)
            .field("cipher", &self.keys.cipher_label())
            .field("verdicts", &self.verdicts)
            .finish_non_exhaustive()
    }
}

/// Why a session could not be established.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EstablishError {
    /// The TCP connection failed.
    #[error("cannot connect to {server}: {source}")]
    Connect {
        /// The server as configured.
        server: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The server did not answer the handshake in time.
    #[error("no handshake answer from {server} within {deadline:?}")]
    HandshakeTimeout {
        /// The server as configured.
        server: String,
        /// The deadline.
        deadline: Duration,
    },
    /// The server closed in silence: the usual sign of a wrong PSK.
    #[error(
        "{server} closed the connection during the handshake: the PSKs probably differ (or it is not a Warren server)"
    )]
    ClosedDuringHandshake {
        /// The server as configured.
        server: String,
    },
    /// The server refused the session (e.g. no common cipher); retrying will not help.
    #[error("the server refused this client: {0}")]
    Refused(Refusal),
    /// The handshake failed otherwise.
    #[error("{0}")]
    Handshake(PreambleError),
    /// The QUIC connection or its authentication failed.
    #[error("QUIC to {server}: {error}")]
    Quic {
        /// The server as configured.
        server: String,
        /// What failed, with its fix.
        error: String,
    },
    /// The hello got no answer in time.
    #[error("the server did not answer the hello in time")]
    HelloTimeout,
    /// The hello exchange failed.
    #[error("hello failed: {0}")]
    Hello(String),
    /// The server proved it knows the PSK, then refused the hello and said why.
    #[error("the server refused the hello: {reason}")]
    HelloRefused {
        /// The server's reason (with its fix).
        reason: String,
        /// Whether trying again later may work.
        retry: bool,
    },
}

/// One service a hello claims: its name, the token to prove, and how it is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim<'a> {
    /// The service name.
    pub name: &'a str,
    /// The token whose knowledge the claim proves.
    pub token: &'a Secret,
    /// Reverse, forward or client-declared.
    pub kind: ClaimKind,
    /// This client's share of the service's visitors.
    pub weight: u16,
    /// `false` to join the service withdrawn (its target fails its health check).
    pub ready: bool,
}

/// Connects with `dial` (directly or through a proxy; `server` names it in messages), runs
/// the handshake offering `ciphers` (with its figures under `fastest`), and sends a hello
/// with `claims` in as many parts as they need. [`HelloMode::Probe`] (or zero claims)
/// makes a probe session: the server judges the claims but serves nothing and takes
/// nothing over; the session answers pings. One `deadline` bounds each of connect,
/// handshake and hello.
///
/// # Errors
/// [`EstablishError`], naming the step that failed.
pub async fn establish(
    dial: impl Future<Output = std::io::Result<Connected>>,
    server: &str,
    psk: &Secret,
    ciphers: &CipherPolicy,
    claims: &[Claim<'_>],
    mode: HelloMode,
    deadline: Duration,
) -> Result<EstablishedSession, EstablishError> {
    let started = Instant::now();
    let connected = dial.await.map_err(|source| EstablishError::Connect {
        server: server.to_owned(),
        source,
    })?;
    let connect_time = started.elapsed();
    let server_addr = connected.peer;
    let congestion = connected.congestion;
    // `tls` binds the handshake to the TLS session; `wss` proves it, in case nothing
    // between here and the server ends the TLS (see `warren_proto::speed_ext`).
    let mut stream = connected.wire;
    let tls = connected.binding.filter(|_| stream.websocket().is_none());
    let noise_psk = keys::bound_noise_psk(&keys::noise_psk(psk), tls.as_ref());
    let tls_proof = connected
        .binding
        .filter(|_| tls.is_none())
        .map(|exporter| keys::tls_proof(&noise_psk, &exporter));
    let started = Instant::now();
    let established = match tokio::time::timeout(
        deadline,
        preamble::client_handshake(&mut stream, &noise_psk, ciphers, tls_proof),
    )
    .await
    {
        Err(_) => {
            return Err(EstablishError::HandshakeTimeout {
                server: server.to_owned(),
                deadline,
            });
        }
        Ok(Ok(established)) => established,
        Ok(Err(PreambleError::Handshake(HandshakeError::Refused(refusal)))) => {
            return Err(EstablishError::Refused(refusal));
        }
        Ok(Err(PreambleError::Io(e)))
            if matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
            ) =>
        {
            return Err(EstablishError::ClosedDuringHandshake {
                server: server.to_owned(),
            });
        }
        Ok(Err(e)) => return Err(EstablishError::Handshake(e)),
    };
    let handshake_time = started.elapsed();
    let keys = SessionKeys::new(&established).on_tls(tls.is_some());
    let (sealer, opener) = keys.control_channel(Side::Client);
    let channel = Stream::tcp(Channel::new(stream, sealer, opener));
    let up = Authenticated {
        channel,
        carrier: Carrier::Tcp { congestion },
        keys,
        server_addr,
        connect_time,
        handshake_time,
    };
    up.hello(claims, mode, deadline).await
}

/// A session whose handshake is done, before its hello: what both transports hand to
/// [`Authenticated::hello`].
struct Authenticated {
    channel: Stream,
    carrier: Carrier,
    keys: SessionKeys,
    server_addr: SocketAddr,
    connect_time: Duration,
    handshake_time: Duration,
}

impl Authenticated {
    /// Sends the hello with `claims` (their token proofs bound to this session) and
    /// collects the verdicts within `deadline`.
    async fn hello(
        mut self,
        claims: &[Claim<'_>],
        mode: HelloMode,
        deadline: Duration,
    ) -> Result<EstablishedSession, EstablishError> {
        let claims = proven(claims, &self.keys);
        let started = Instant::now();
        let verdicts =
            match tokio::time::timeout(deadline, hello(&mut self.channel, mode, claims)).await {
                Err(_) => return Err(EstablishError::HelloTimeout),
                Ok(result) => result?,
            };
        Ok(EstablishedSession {
            channel: self.channel,
            carrier: self.carrier,
            keys: self.keys,
            server_addr: self.server_addr,
            verdicts,
            connect_time: self.connect_time,
            handshake_time: self.handshake_time,
            hello_time: started.elapsed(),
        })
    }
}

/// The claims with their token proofs, bound to this session's handshake.
fn proven(claims: &[Claim<'_>], keys: &SessionKeys) -> Vec<HelloClaim> {
    claims
        .iter()
        .map(|claim| HelloClaim {
            claim: ServiceClaim {
                name: claim.name.to_owned(),
                proof: keys::token_proof(claim.token, keys.handshake_hash(), claim.name),
                kind: claim.kind.clone(),
            },
            weight: claim.weight,
            ready: claim.ready,
        })
        .collect()
}

/// As [`establish`], over QUIC: connects `client`'s endpoint to `server_addr` (TLS 1.3 and
/// the PSK proof, or client certificates), then sends the hello on the control stream.
///
/// # Errors
/// [`EstablishError`], naming the step that failed.
pub async fn establish_quic(
    client: &QuicClient,
    server: &str,
    server_addr: SocketAddr,
    claims: &[Claim<'_>],
    mode: HelloMode,
    deadline: Duration,
) -> Result<EstablishedSession, EstablishError> {
    let started = Instant::now();
    crate::client::quic::probe_udp(server_addr)
        .await
        .map_err(|source| EstablishError::Connect {
            server: server.to_owned(),
            source,
        })?;
    let authenticated = client
        .connect(server_addr, deadline)
        .await
        .map_err(|error| quic_establish_error(server, deadline, error))?;
    let handshake_time = started.elapsed();
    let connection = authenticated.connection;
    let binding = crate::session::quic::session_binding(&connection)
        .ok_or_else(|| EstablishError::Hello("the TLS exporter failed".into()))?;
    let (send, recv) = authenticated.control;
    let up = Authenticated {
        channel: crate::session::quic::control_stream(send, recv),
        carrier: Carrier::Quic(connection),
        keys: SessionKeys::for_quic(binding),
        server_addr,
        connect_time: Duration::ZERO,
        handshake_time,
    };
    up.hello(claims, mode, deadline).await
}

/// [`establish_quic`] with a fresh endpoint for `server` (`warren doctor`, `warren ping`:
/// one session each, nothing to resume): resolves it (trying `family` first), then
/// connects with `quic` and `psk`. The endpoint comes back too, for its socket's facts.
///
/// # Errors
/// As [`establish_quic`]; resolution and endpoint failures name the server.
pub async fn establish_quic_once(
    quic: &crate::config::quic::QuicConfig,
    psk: &Secret,
    server: &crate::config::HostPort,
    family: crate::transport::tcp::Family,
    (claims, mode): (&[Claim<'_>], HelloMode),
    deadline: Duration,
) -> Result<(EstablishedSession, QuicClient), EstablishError> {
    let name = server.to_string();
    let addr = crate::client::quic::resolve(server, deadline, family)
        .await
        .map_err(|source| EstablishError::Connect {
            server: name.clone(),
            source,
        })?;
    let client =
        QuicClient::with(quic, psk, server, addr.is_ipv6()).map_err(|e| EstablishError::Quic {
            server: name.clone(),
            error: e.to_string(),
        })?;
    let session = establish_quic(&client, &name, addr, claims, mode, deadline).await?;
    Ok((session, client))
}

fn quic_establish_error(server: &str, deadline: Duration, error: QuicError) -> EstablishError {
    match error {
        QuicError::WrongPsk { .. } => EstablishError::ClosedDuringHandshake {
            server: server.to_owned(),
        },
        QuicError::Timeout { .. } => EstablishError::HandshakeTimeout {
            server: server.to_owned(),
            deadline,
        },
        other => EstablishError::Quic {
            server: server.to_owned(),
            error: other.to_string(),
        },
    }
}

/// Sends the hello in parts and collects the verdicts (one per claim, in order).
async fn hello(
    channel: &mut Stream,
    mode: HelloMode,
    claims: Vec<HelloClaim>,
) -> Result<Vec<Verdict>, EstablishError> {
    let mut reply = ReplyAssembler::new(claims.len());
    let hello_error = |e: &dyn std::fmt::Display| EstablishError::Hello(e.to_string());
    for part in message::hello_parts(mode, claims) {
        control::send_control(channel, &part)
            .await
            .map_err(|e| hello_error(&e))?;
    }
    loop {
        match control::recv_control(channel).await {
            Ok(ControlMessage::HelloReplyPart { verdicts, more }) => {
                if let Some(verdicts) = reply.push(verdicts, more).map_err(|e| hello_error(&e))? {
                    return Ok(verdicts);
                }
            }
            Ok(ControlMessage::Refuse { reason, retry }) => {
                return Err(EstablishError::HelloRefused { reason, retry });
            }
            Ok(other) => {
                return Err(EstablishError::Hello(format!(
                    "unexpected answer to hello: {other:?}"
                )));
            }
            Err(control::SessionEnd::Goodbye(reason)) => {
                return Err(EstablishError::HelloRefused {
                    reason,
                    retry: true,
                });
            }
            Err(end) => return Err(hello_error(&end)),
        }
    }
}

/// Round trip of one `Ping` on an established session's control channel (answering the
/// server's own pings meanwhile).
///
/// # Errors
/// The session ended or broke the protocol, or no answer within `deadline`.
pub async fn ping(
    channel: &mut Stream,
    seq: u64,
    deadline: Duration,
) -> Result<Duration, EstablishError> {
    let started = Instant::now();
    let exchange = async {
        control::send_control(channel, &ControlMessage::Ping { seq })
            .await
            .map_err(|e| EstablishError::Hello(e.to_string()))?;
        loop {
            match control::recv_control(channel).await {
                Ok(ControlMessage::Pong { seq: got }) if got == seq => return Ok(started.elapsed()),
                Ok(ControlMessage::Ping { seq: theirs }) => {
                    control::send_control(channel, &ControlMessage::Pong { seq: theirs })
                        .await
                        .map_err(|e| EstablishError::Hello(e.to_string()))?;
                }
                Ok(_) => {}
                Err(end) => return Err(EstablishError::Hello(end.to_string())),
            }
        }
    };
    tokio::time::timeout(deadline, exchange)
        .await
        .unwrap_or(Err(EstablishError::HelloTimeout))
}

/// A probe session (a hello claiming nothing) with `server`, over QUIC when `quic` is given
/// and over TCP offering `ciphers` otherwise: what `warren ping` and the peer-to-peer
/// mailbox open. `deadline` bounds each step.
///
/// # Errors
/// [`EstablishError`], naming the step that failed.
pub async fn probe_session(
    server: &crate::config::HostPort,
    psk: &Secret,
    (ciphers, choice): (&[warren_proto::CipherSuite], warren_proto::CipherChoice),
    quic: Option<&crate::config::quic::QuicConfig>,
    deadline: Duration,
) -> Result<EstablishedSession, EstablishError> {
    match quic {
        Some(quic) => Ok(establish_quic_once(
            quic,
            psk,
            server,
            crate::transport::tcp::Family::Any,
            (&[], HelloMode::Probe),
            deadline,
        )
        .await?
        .0),
        None => {
            // Under `ordered` nothing is measured up front: the one key this session makes
            // chooses its implementation when it is made (the P2P mailbox's first message
            // should not wait ~40 ms for figures nobody reads).
            let policy = match choice {
                warren_proto::CipherChoice::Ordered => {
                    crate::crypto::speed::policy(ciphers, choice)
                }
                warren_proto::CipherChoice::Fastest => {
                    crate::crypto::speed::policy_measured(ciphers, choice).await
                }
            };
            // Ping and the P2P mailbox speak `noise`; the web transports are the client's.
            // A relayed transfer's TCP leg is one of these: it runs the default congestion
            // control of every tunnel connection.
            let dial = async {
                let how = (
                    crate::transport::tcp::Family::Any,
                    &crate::transport::congestion::TcpCongestion::Auto,
                );
                let stream =
                    crate::transport::tcp::dial_server(server, None, None, deadline, how).await?;
                ClientLayers::plain().wrap(stream).await
            };
            establish(
                dial,
                &server.to_string(),
                psk,
                &policy,
                &[],
                HelloMode::Probe,
                deadline,
            )
            .await
        }
    }
}

/// Says goodbye on an established session and closes it (best effort, bounded).
pub async fn goodbye(mut channel: Stream, reason: &str) {
    let message = ControlMessage::Goodbye {
        reason: reason.to_owned(),
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = control::send_control(&mut channel, &message).await;
        let _ = channel.writer.shutdown().await;
    })
    .await;
}
