//! The server's half of forward services and client-declared services.
//!
//! * **Judging a hello** ([`judge`]): each claim says how the client sees the service
//!   (`ClaimKind`). Reverse claims name a service of the server's config that it binds;
//!   forward claims name (or select by target) a forward service, whose target the server
//!   dials; declared claims ask the server to bind a port inside `allow_ports`. A wrong token
//!   gets the generic `Refused`; a right token for something the server cannot do gets
//!   `Denied` with a reason the client logs (wrong direction, port outside the range, port
//!   in use).
//!   A forward or declared claim also says TCP or UDP; a claim whose protocol differs from
//!   the server's forward service is `Denied` with the fix. Declared UDP services get a UDP
//!   socket in the range, served like a reverse UDP service (default UDP bounds) until the
//!   session ends.
//! * **Forward streams** ([`accept_open_channel`], [`serve_forward`]): the client opens a
//!   data channel with the `KIND_DATA_OPEN` preamble and sends `StreamOpen` at once; the
//!   channel never joins the idle pool. The server dials the target its config names for
//!   that service (never one the client names), first writing a PROXY header built from the
//!   `StreamOpen`'s visitor address when the service sets `proxy_protocol`, and relays. A
//!   UDP forward service's channel is a datagram channel: the server keeps one socket per
//!   flow towards the target ([`crate::relay::udp::targets`]).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use tokio::net::{TcpListener, UdpSocket};
use tracing::{debug, warn};
use warren_proto::balance::Strategy;
use warren_proto::handshake::DataHello;
use warren_proto::message::{
    self, ClaimKind, HelloClaim, Protocol, ServiceClaim, StreamOpen, Verdict,
};

use super::session::ServerSession;
use super::{Authenticated, Rejected, ServiceSlot, Shared, serve_visitors, udp};
use crate::config::proxy::PortRange;
use crate::config::{HostPort, ServerConfig, ServerForward, ServiceKind, UdpSettings};
use crate::crypto::keys::{self, SessionKeys};
use crate::crypto::secret::Secret;
use crate::metrics::Meter;
use crate::relay;
use crate::relay::udp::UdpEnd;
use crate::session::link::{Replenish, StreamHandler};
use crate::session::stream::Stream;
use crate::transport::tcp;
use crate::transport::wire::Wire;

/// How long dialing a forward service's target may take.
const TARGET_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most ports tried when a client asks for any free port in `allow_ports`.
const MAX_PORT_ATTEMPTS: usize = 512;

/// What the server decided about one hello.
pub(super) struct Judgement {
    /// One per claim, in order.
    pub verdicts: Vec<Verdict>,
    /// Reverse services of the config this session now serves.
    pub reverse: Vec<String>,
    /// Forward services: the client's name for it -> the server's forward service (whose
    /// target the server dials).
    pub forwards: HashMap<String, ServerForward>,
    /// Declared services: name and the socket bound for it.
    pub declared: Vec<(String, DeclaredSocket)>,
    /// Declared http services: name and the host names granted.
    pub declared_http: Vec<(String, Vec<String>)>,
    /// Claims refused for a wrong token or an unknown name (for the log).
    pub refused: Vec<String>,
}

/// The port bound for a client-declared service.
pub(super) enum DeclaredSocket {
    Tcp(TcpListener),
    Udp(UdpSocket),
}

impl DeclaredSocket {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            DeclaredSocket::Tcp(listener) => listener.local_addr(),
            DeclaredSocket::Udp(socket) => socket.local_addr(),
        }
    }
}

/// The protocol a service kind carries.
fn protocol_of(kind: ServiceKind) -> Protocol {
    match kind {
        ServiceKind::Tcp | ServiceKind::Http => Protocol::Tcp,
        ServiceKind::Udp(_) => Protocol::Udp,
    }
}

fn protocol_name(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

impl Judgement {
    /// Names of every accepted claim.
    pub fn accepted(&self) -> Vec<String> {
        let mut names = self.reverse.clone();
        names.extend(self.forwards.keys().cloned());
        names.extend(self.declared.iter().map(|(name, _)| name.clone()));
        names.extend(self.declared_http.iter().map(|(name, _)| name.clone()));
        names
    }
}

/// Decides every claim of a hello; binds the ports of accepted declared services, unless
/// the hello only `probe`s (then a declared claim is judged as far as it can be without
/// binding: token, rules, range).
pub(super) async fn judge(
    shared: &Shared,
    keys: &SessionKeys,
    claims: &[HelloClaim],
    peer: SocketAddr,
    probe: bool,
) -> Judgement {
    let mut judgement = Judgement {
        verdicts: Vec::with_capacity(claims.len()),
        reverse: Vec::new(),
        forwards: HashMap::new(),
        declared: Vec::new(),
        declared_http: Vec::new(),
        refused: Vec::new(),
    };
    let live = shared.live();
    let config = &live.config;
    let proves = |token: &Secret, claim: &ServiceClaim| {
        keys::verify_token_proof(token, keys.handshake_hash(), &claim.name, &claim.proof)
    };
    for claim in claims.iter().map(|claim| &claim.claim) {
        let verdict = match &claim.kind {
            ClaimKind::Reverse => {
                if let Some(slot) = shared
                    .slot(&claim.name)
                    .filter(|slot| proves(&slot.token, claim))
                {
                    judgement.reverse.push(slot.name.clone());
                    Verdict::Accepted { bound: None }
                } else if config
                    .forwards
                    .get(&claim.name)
                    .is_some_and(|f| proves(&f.token, claim))
                {
                    denied(format!(
                        "`{}` is a forward service on the server (the server dials its target); give the client's service `bind` instead of `target`",
                        claim.name
                    ))
                } else {
                    Verdict::Refused
                }
            }
            ClaimKind::Forward { target } | ClaimKind::ForwardUdp { target } => {
                let found = match target {
                    Some(wanted) => {
                        let wanted = wanted.parse::<HostPort>().ok();
                        let matching: Vec<&ServerForward> = config
                            .forwards
                            .values()
                            .filter(|f| {
                                Some(&f.target) == wanted.as_ref() && proves(&f.token, claim)
                            })
                            .collect();
                        // One target may be forwarded for TCP and for UDP (DNS): the
                        // claim's protocol picks; another one only earns a clear denial.
                        matching
                            .iter()
                            .find(|f| Some(protocol_of(f.kind)) == claim.kind.protocol())
                            .or(matching.first())
                            .copied()
                    }
                    None => config
                        .forwards
                        .get(&claim.name)
                        .filter(|f| proves(&f.token, claim)),
                };
                let wanted = claim.kind.protocol();
                if let Some(forward) = found.filter(|f| Some(protocol_of(f.kind)) != wanted) {
                    denied(format!(
                        "`{}` is a {} forward service on the server; set type = \"{}\" on the client's service",
                        claim.name, forward.kind, forward.kind
                    ))
                } else if let Some(forward) = found {
                    judgement
                        .forwards
                        .insert(claim.name.clone(), forward.clone());
                    Verdict::Accepted { bound: None }
                } else if target.is_none()
                    && config
                        .services
                        .get(&claim.name)
                        .is_some_and(|s| proves(&s.token, claim))
                {
                    denied(format!(
                        "`{}` is a reverse service on the server (the server binds its port); give the client's service `target` instead of `bind`",
                        claim.name
                    ))
                } else {
                    Verdict::Refused
                }
            }
            ClaimKind::DeclaredHttp { subdomain, hosts } => {
                let token_ok = config
                    .default_token
                    .as_ref()
                    .is_some_and(|token| proves(token, claim));
                if token_ok {
                    match super::http::judge_declared(
                        shared,
                        config,
                        &claim.name,
                        subdomain.as_deref(),
                        hosts,
                    ) {
                        Ok(granted) => {
                            let urls = super::http::urls(config, &granted);
                            if !probe {
                                judgement.declared_http.push((claim.name.clone(), granted));
                            }
                            Verdict::AcceptedHttp { urls }
                        }
                        Err(reason) => {
                            warn!(event = "declared_denied", %peer, service = %claim.name, %reason, "refused a client-declared http service");
                            denied(reason)
                        }
                    }
                } else {
                    Verdict::Refused
                }
            }
            ClaimKind::Declared { remote_bind } | ClaimKind::DeclaredUdp { remote_bind } => {
                let protocol = claim.kind.protocol().unwrap_or(Protocol::Tcp);
                let token_ok = config
                    .default_token
                    .as_ref()
                    .is_some_and(|token| proves(token, claim));
                if !token_ok {
                    Verdict::Refused
                } else if probe {
                    match declared_addr(config, &claim.name, *remote_bind) {
                        Ok(_) => Verdict::Accepted { bound: None },
                        Err(reason) => denied(reason),
                    }
                } else {
                    match bind_declared(config, &claim.name, *remote_bind, protocol).await {
                        Ok(socket) => {
                            let bound = socket.local_addr().ok();
                            debug!(event = "declared_bound", %peer, service = %claim.name, protocol = protocol_name(protocol), bound = ?bound, "bound a client-declared service");
                            judgement.declared.push((claim.name.clone(), socket));
                            Verdict::Accepted { bound }
                        }
                        Err(reason) => {
                            warn!(event = "declared_denied", %peer, service = %claim.name, %reason, "refused a client-declared service");
                            denied(reason)
                        }
                    }
                }
            }
        };
        if verdict == Verdict::Refused {
            judgement.refused.push(claim.name.clone());
        }
        judgement.verdicts.push(verdict);
    }
    judgement
}

fn denied(reason: String) -> Verdict {
    let mut reason = reason;
    reason.truncate(message::MAX_REASON_LEN);
    Verdict::Denied { reason }
}

/// Binds one declared port of `protocol`.
async fn bind_one(addr: SocketAddr, protocol: Protocol) -> io::Result<DeclaredSocket> {
    match protocol {
        Protocol::Tcp => TcpListener::bind(addr).await.map(DeclaredSocket::Tcp),
        Protocol::Udp => crate::relay::udp::bind_service_socket(addr).map(DeclaredSocket::Udp),
    }
}

/// Where a declared service may bind under the server's rules: the IP, and the port
/// range it must come from (the wanted port is checked against it). Binds nothing.
fn declared_addr(
    config: &ServerConfig,
    name: &str,
    wanted: SocketAddr,
) -> Result<(IpAddr, PortRange), String> {
    let Some(range) = config.allow_ports else {
        return Err(
            "this server does not accept client-declared services (its config sets no allow_ports)"
                .to_owned(),
        );
    };
    if config.services.contains_key(name) || config.forwards.contains_key(name) {
        return Err(format!(
            "the name `{name}` belongs to a service in the server's config; choose another name"
        ));
    }
    let allowed = config.declared_bind_addrs();
    let ip = if allowed.contains(&wanted.ip()) {
        wanted.ip()
    } else if wanted.ip().is_unspecified() {
        allowed[0]
    } else {
        let list: Vec<String> = allowed.iter().map(IpAddr::to_string).collect();
        return Err(format!(
            "address {} is not in the server's allow_bind_addrs ({})",
            wanted.ip(),
            list.join(", ")
        ));
    };
    if wanted.port() != 0 && !range.contains(wanted.port()) {
        return Err(format!(
            "port {} is outside the server's allow_ports {range}",
            wanted.port()
        ));
    }
    Ok((ip, range))
}

/// Binds a declared service's port inside the server's `allow_ports` / `allow_bind_addrs`.
async fn bind_declared(
    config: &ServerConfig,
    name: &str,
    wanted: SocketAddr,
    protocol: Protocol,
) -> Result<DeclaredSocket, String> {
    let (ip, range) = declared_addr(config, name, wanted)?;
    if wanted.port() != 0 {
        return bind_one(SocketAddr::new(ip, wanted.port()), protocol)
            .await
            .map_err(|e| match e.kind() {
                io::ErrorKind::AddrInUse => {
                    let udp = if protocol == Protocol::Udp {
                        "UDP "
                    } else {
                        ""
                    };
                    format!("{udp}port {} is in use on the server", wanted.port())
                }
                _ => format!("cannot bind {}: {e}", SocketAddr::new(ip, wanted.port())),
            });
    }
    // Any free port: start at a random place in the range so clients spread out.
    let len = usize::from(range.end - range.start) + 1;
    let offset = (rand::rng().next_u32() as usize) % len;
    for i in 0..len.min(MAX_PORT_ATTEMPTS) {
        // Invariant: (offset + i) % len < len <= 65535 - start + 1, so the sum fits a u16.
        let port = range.start + u16::try_from((offset + i) % len).unwrap_or(0);
        if let Ok(socket) = bind_one(SocketAddr::new(ip, port), protocol).await {
            return Ok(socket);
        }
    }
    Err(format!(
        "no free port in the server's allow_ports {range} (tried {})",
        len.min(MAX_PORT_ATTEMPTS)
    ))
}

/// Serves the declared services of a new session on the ports bound for them; each ends
/// (and its port is released) when the session ends.
pub(super) fn serve_declared(
    shared: &Arc<Shared>,
    session: &Arc<ServerSession>,
    declared: Vec<(String, DeclaredSocket)>,
) {
    for (name, socket) in declared {
        let kind = match socket {
            DeclaredSocket::Tcp(_) => ServiceKind::Tcp,
            // The client's bounds are its own; the server's side of a declared service
            // uses the defaults, which bound its table all the same.
            DeclaredSocket::Udp(_) => ServiceKind::Udp(UdpSettings::DEFAULT),
        };
        let slot = Arc::new(ServiceSlot::new(
            name.clone(),
            kind,
            Secret::default(),
            shared.telemetry.metrics.service(&name),
            // Its visitors' streams outlive the session, as those of configured services do.
            shared.cancel.child_token(),
            Strategy::default(),
        ));
        // A declared port belongs to the one session that declared it.
        slot.join(session, 1, true);
        let until = session.cancel.clone();
        match socket {
            DeclaredSocket::Tcp(listener) => {
                shared.tasks.spawn(serve_visitors(
                    Arc::clone(shared),
                    slot,
                    Arc::new(listener),
                    Some(until),
                ));
            }
            DeclaredSocket::Udp(socket) => {
                let service = udp::UdpService {
                    slot,
                    socket: Arc::new(socket),
                    settings: UdpSettings::DEFAULT,
                    stats: shared.telemetry.metrics.udp_stats(&name, UdpEnd::Visitors),
                };
                shared
                    .tasks
                    .spawn(udp::serve_udp(Arc::clone(shared), service, until));
            }
        }
    }
}

/// Authenticates a `KIND_DATA_OPEN` channel and reads its `StreamOpen` (all under the
/// connection's handshake deadline).
pub(super) async fn accept_open_channel(
    shared: &Arc<Shared>,
    stream: Wire,
    hello: &DataHello,
    binding: Option<[u8; 32]>,
) -> Result<Authenticated, Rejected> {
    let (session, channel) =
        super::accept_channel_of_session(shared, stream, hello, binding).await?;
    let mut channel = Stream::tcp(channel);
    let (open, forward) = accept_forward(&session, &mut channel).await?;
    Ok(Authenticated::Forward {
        session,
        channel: Box::new(channel),
        open,
        forward: Box::new(forward),
    })
}

/// Serves the streams a client opens for its forward services, on transports that carry
/// them on the session's connection (QUIC).
pub(super) struct ForwardStreams {
    pub(super) shared: Arc<Shared>,
    pub(super) session: Arc<ServerSession>,
}

impl StreamHandler for ForwardStreams {
    async fn serve(&self, open: StreamOpen, mut stream: Stream, _: Replenish) -> Option<Stream> {
        match forward_for(&self.session, &open, &mut stream).await {
            Ok(forward) => {
                let session = Arc::clone(&self.session);
                // Counted on the session: a drain waits for it.
                (self.session.vitals)
                    .counting(serve_forward(&self.shared, session, stream, open, forward))
                    .await;
            }
            Err(rejected) => rejected.log(self.session.peer),
        }
        None
    }
}

/// Reads the `StreamOpen` a client-opened stream starts with and finds the forward service
/// it names among those granted to `session`; a stream for anything else is reset.
async fn accept_forward(
    session: &ServerSession,
    channel: &mut Stream,
) -> Result<(StreamOpen, ServerForward), Rejected> {
    let open = match channel.reader.read_message().await {
        Ok(Ok(bytes)) => message::decode_stream_open(bytes)
            .map_err(|e| Rejected::Protocol(format!("bad stream open: {e}")))?,
        Ok(Err(_)) => {
            return Err(Rejected::Protocol(
                "forward stream reset before its stream open".into(),
            ));
        }
        Err(e) => return Err(Rejected::Protocol(e.to_string())),
    };
    let forward = forward_for(session, &open, channel).await?;
    Ok((open, forward))
}

/// The forward service `open` names among those granted to `session`; a stream for
/// anything else is reset.
async fn forward_for(
    session: &ServerSession,
    open: &StreamOpen,
    channel: &mut Stream,
) -> Result<ServerForward, Rejected> {
    let Some(forward) = session.forwards.get(&open.service).cloned() else {
        let _ = channel
            .writer
            .reset("not a forward service of this session")
            .await;
        return Err(Rejected::Protocol(format!(
            "stream open for `{}`, which is not a forward service of this session",
            open.service
        )));
    };
    Ok(forward)
}

/// Dials a forward service's target and relays (a UDP service: carries the channel's
/// datagrams to the target, one socket per flow).
pub(super) async fn serve_forward(
    shared: &Arc<Shared>,
    session: Arc<ServerSession>,
    mut channel: Stream,
    open: StreamOpen,
    forward: ServerForward,
) {
    let service = open.service;
    let target = forward.target;
    if let ServiceKind::Udp(settings) = forward.kind {
        let side = relay::udp::targets::TargetSide {
            name: &service,
            target: &target,
            settings,
            tasks: &shared.tasks,
            cancel: session.cancel.clone(),
            stats: shared
                .telemetry
                .metrics
                .udp_stats(&forward.name, UdpEnd::Targets),
            limit: shared.limits.get(&forward.name),
        };
        relay::udp::targets::serve(side, channel).await;
        return;
    }
    let mut stream = match tcp::connect(&target, TARGET_CONNECT_TIMEOUT).await {
        Ok(stream) => stream,
        Err(error) => {
            warn!(event = "target_unreachable", %service, %target, %error, "cannot reach the forward service's target");
            let reason = format!("target unreachable: {error}");
            let _ = channel.writer.reset(&reason).await;
            return;
        }
    };
    if let Some(version) = forward.proxy_protocol
        && let Err(error) =
            relay::write_proxy_header(&mut stream, &mut channel, version, open.visitor, open.local)
                .await
    {
        warn!(event = "target_write_failed", %service, %target, %error, "cannot send the PROXY header to the target");
        return;
    }
    debug!(event = "forward_opened", %service, %target, visitor = ?open.visitor, peer = %session.peer, "forward stream opened");
    let shaping = Meter::shaping(shared.limits.get(&forward.name), forward.compression);
    match relay::pump_metered(stream, &mut channel, &shared.cancel, shaping.as_ref()).await {
        Ok(moved) => {
            debug!(event = "stream_closed", %service, up = moved.to_tunnel, down = moved.to_local, "forward stream done")
        }
        Err(error) => {
            debug!(event = "stream_aborted", %service, %error, "forward stream aborted")
        }
    }
}
