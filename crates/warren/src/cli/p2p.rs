//! `warren p2p listen` and `warren p2p connect`: a TCP or UDP service reached peer to peer
//! through a join code (the command line over [`warren::p2p::tunnel`]).
//!
//! `listen` prints a code and serves every `connect` that brings it (one after another at
//! the mailbox, then all at once), until stopped or until nobody has used the code for the
//! server's `nameplate_ttl`. With `--service NAME` (a `[server.p2p.services.NAME]` of the
//! server's, and its token from `WARREN_TOKEN` or `--token-file`) there is no code: both
//! sides meet by the name for as long as the listener runs, and the token is the password
//! of their key exchange (never sent). `connect` binds its local port once, joins, and when the
//! connection drops joins again with the same code, keeping the port; visitors that come
//! while it is away are reset (TCP) or dropped (UDP).
//!
//! Output as for `warren send`: lines for people on stderr, `--json` events on stdout
//! (`code` or `offered`, `connected`, `listening`, `disconnected`, `notice`).

use std::net::SocketAddr;
use std::sync::Arc;

use clap::{Args, Subcommand};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use warren::config::{HostPort, UdpSettings};
use warren::p2p::code::Code;
use warren::p2p::listen::{self, Listener};
use warren::p2p::pake::CertFingerprint;
use warren::p2p::session::{self, Meeting, Options, Purpose};
use warren::p2p::transfer::identity::Identity;
use warren::p2p::tunnel::{Entrance, Event, Exit, Kind, Reporter, TunnelStats};

use super::files::{Failure, Output, ServerArgs, options, read_code};

/// Peers one `warren p2p listen` serves at once.
const MAX_PEERS: u32 = 256;

/// `warren p2p`.
#[derive(Debug, Clone, Subcommand)]
pub enum P2pCommand {
    /// Serve a local TCP or UDP service to whoever has the printed code.
    #[command(
        after_help = "Examples:\n  WARREN_PSK=... warren p2p listen --tcp 127.0.0.1:22 --server tunnel.example.com:7000\n  warren p2p listen --udp 127.0.0.1:53 --max-peers 4"
    )]
    Listen(ListenArgs),
    /// Reach the service of a `warren p2p listen` on a local port.
    #[command(
        after_help = "Examples:\n  WARREN_CODE=1234-acid-acorn-acre warren p2p connect --bind 127.0.0.1:2222\n  ssh -p 2222 user@127.0.0.1"
    )]
    Connect(ConnectArgs),
    /// Print this machine's long-term P2P identity (its fingerprint), creating the key
    /// file if it does not exist: the other end pins it with `peer = "..."` or `--peer`.
    #[command(after_help = "Examples:\n  warren p2p identity /var/lib/warren/p2p.key")]
    Identity {
        /// The key file (PEM, mode 0600), as `p2p_identity` in [client] or `--identity`.
        #[arg(value_name = "FILE")]
        file: std::path::PathBuf,
    },
}

/// `warren p2p listen`.
#[derive(Debug, Clone, Args)]
pub struct ListenArgs {
    /// The TCP service to offer, HOST:PORT.
    #[arg(
        long,
        value_name = "HOST:PORT",
        required_unless_present = "udp",
        conflicts_with = "udp"
    )]
    pub tcp: Option<String>,
    /// The UDP service to offer, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub udp: Option<String>,
    /// How many peers may be connected at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=MAX_PEERS as i64))]
    pub max_peers: u32,
    #[command(flatten)]
    pub named: NamedArgs,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// A named P2P service instead of a code (both commands).
#[derive(Debug, Clone, Args)]
pub struct NamedArgs {
    /// Meet by this name, a [server.p2p.services.NAME] of the server's, instead of a code:
    /// for tunnels that stay. Its token comes from WARREN_TOKEN or --token-file.
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,
    /// Read the service's token from this file (first line). Default: WARREN_TOKEN.
    #[arg(long, value_name = "FILE", requires = "service")]
    pub token_file: Option<std::path::PathBuf>,
    /// Present this long-term identity (a key file, created if missing; see `warren p2p
    /// identity`) instead of a fresh one.
    #[arg(long, value_name = "FILE")]
    pub identity: Option<std::path::PathBuf>,
    /// Accept only the other end whose identity is this (64 hex digits).
    #[arg(long, value_name = "FINGERPRINT")]
    pub peer: Option<String>,
}

impl NamedArgs {
    /// Adds `--identity` and `--peer` to `options`.
    fn identify(&self, options: &mut Options) -> Result<(), Failure> {
        if let Some(path) = &self.identity {
            let identity =
                Identity::load_or_create(path).map_err(|e| Failure::Usage(e.to_string()))?;
            options.identity = Some(Arc::new(identity));
        }
        if let Some(text) = &self.peer {
            options.pin = Some(CertFingerprint::parse(text).map_err(Failure::Usage)?);
        }
        Ok(())
    }

    /// The named service and its token, if `--service` was given.
    fn meeting(&self) -> Result<Option<Meeting>, Failure> {
        let Some(name) = &self.service else {
            return Ok(None);
        };
        let token = crate::cli::token(self.token_file.as_deref()).map_err(Failure::Usage)?;
        Ok(Some(Meeting::Service {
            name: name.clone(),
            token,
        }))
    }
}

/// `warren p2p connect`.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// The code from `warren p2p listen`. Other users can see arguments in `ps`: prefer
    /// WARREN_CODE or typing it at the prompt.
    #[arg(value_name = "CODE", conflicts_with = "service")]
    pub code: Option<String>,
    /// The local address visitors use (TCP or UDP, as the other side serves).
    #[arg(long, short = 'b', value_name = "ADDR:PORT")]
    pub bind: SocketAddr,
    #[command(flatten)]
    pub named: NamedArgs,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Runs a `warren p2p` command until it fails or `stop` fires.
///
/// # Errors
///
/// [`Failure`] with the reason.
pub async fn run(command: P2pCommand, stop: CancellationToken) -> Result<(), Failure> {
    match command {
        P2pCommand::Listen(args) => listen(args, stop).await,
        P2pCommand::Connect(args) => connect(args, stop).await,
        P2pCommand::Identity { file } => {
            let identity =
                Identity::load_or_create(&file).map_err(|e| Failure::Failed(e.to_string()))?;
            println!("{}", identity.fingerprint().hex());
            Ok(())
        }
    }
}

async fn listen(args: ListenArgs, stop: CancellationToken) -> Result<(), Failure> {
    let (kind, target) = match (&args.tcp, &args.udp) {
        (Some(tcp), _) => (Kind::Tcp, tcp),
        (None, Some(udp)) => (Kind::Udp, udp),
        // clap requires one of them.
        (None, None) => return Err(Failure::Usage("give --tcp or --udp".into())),
    };
    let target: HostPort = target.parse().map_err(|e| {
        Failure::Usage(format!(
            "invalid service address {target:?}: {e}; write HOST:PORT, e.g. 127.0.0.1:22"
        ))
    })?;
    let exit = Arc::new(Exit {
        kind,
        target,
        udp: UdpSettings::DEFAULT,
    });
    let out = Output::new(args.server.json);
    let mut options = options(&args.server)?;
    options.purpose = Purpose::Tunnel;
    args.named.identify(&mut options)?;
    let service = match args.named.meeting()? {
        Some(Meeting::Service { name, token }) => Some((name, token)),
        _ => None,
    };
    let listener = Listener {
        exit: Arc::clone(&exit),
        service,
        options,
        max_peers: args.max_peers as usize,
        stats: Arc::new(TunnelStats::default()),
    };
    let stats = Arc::clone(&listener.stats);
    let service = args.named.service.clone();
    let report: Reporter = Arc::new(move |event| match event {
        Event::Offered(code) => announce(&out, code, service.as_deref(), &exit),
        Event::Retrying { error, pause } => out.notice(&format!(
            "{error}; trying again in {:.1} s",
            pause.as_secs_f32()
        )),
        other => report_peer(&out, &stats, other),
    });
    listen::keep_offered(&listener, &stop, &report)
        .await
        .map_err(Failure::Failed)
}

/// Says how to reach the exit: its code, or its service name.
fn announce(out: &Output, code: Option<&Code>, service: Option<&str>, exit: &Exit) {
    let kind = exit.kind.word();
    match code {
        Some(code) => {
            let code = code.reveal();
            out.event(json!({"event": "code", "code": code}));
            out.say(&format!(
                "Serving {kind} {} to whoever has the code:\n\n    {code}\n\nOn the other side: warren p2p connect --bind 127.0.0.1:PORT (and the code)",
                exit.target
            ));
        }
        None => {
            let service = service.unwrap_or_default();
            out.event(json!({"event": "offered", "service": service}));
            out.say(&format!(
                "Serving {kind} {} as P2P service `{service}`: on the other side, warren p2p connect --service {service} --bind 127.0.0.1:PORT (with the service's token)",
                exit.target
            ));
        }
    }
}

/// The events both commands print the same way.
fn report_peer(out: &Output, stats: &TunnelStats, event: Event<'_>) {
    match event {
        Event::Connected(connected) => out.connected(connected),
        Event::Disconnected { peer, reason } => {
            disconnected(out, &peer.peer.short(), reason, stats);
        }
        Event::Retrying { error, pause } => out.notice(&format!(
            "joining again failed ({error}); next try in {:.1} s",
            pause.as_secs_f32()
        )),
        Event::Moved { peer, route } => {
            let address = match route {
                session::Route::Direct(addr) | session::Route::Relayed(addr) => addr,
            };
            out.event(json!({
                "event": "moved", "peer": peer.peer.short(), "route": route.word(),
                "address": address.to_string(),
            }));
            out.say(&format!(
                "Moved to the {} path ({address}), streams untouched",
                route.word()
            ));
        }
        Event::Notice(notice) => out.notice(notice),
        Event::Offered(_) => {}
    }
}

async fn connect(args: ConnectArgs, stop: CancellationToken) -> Result<(), Failure> {
    let meeting = match args.named.meeting()? {
        Some(meeting) => meeting,
        None => Meeting::Code(read_code(args.code.as_deref()).await?),
    };
    let out = Output::new(args.server.json);
    let mut options = options(&args.server)?;
    options.purpose = Purpose::Tunnel;
    args.named.identify(&mut options)?;
    let connected = session::join_meeting(&meeting, &options)
        .await
        .map_err(|e| Failure::Failed(e.to_string()))?;
    let kind = Entrance::hello(&connected.connection)
        .await
        .map_err(|e| Failure::Failed(e.to_string()))?;
    let stats = Arc::new(TunnelStats::default());
    let entrance = Entrance::bind(kind, args.bind, UdpSettings::DEFAULT, Arc::clone(&stats))
        .await
        .map_err(|e| Failure::Usage(e.to_string()))?;
    out.connected(&connected);
    let local = entrance.local_addr();
    out.event(json!({"event": "listening", "address": local.to_string(), "kind": kind.word()}));
    out.say(&format!(
        "Listening on {local} ({}): visitors reach the other side's service",
        kind.word()
    ));
    let report: Reporter = Arc::new(move |event| report_peer(&out, &stats, event));
    let result = entrance
        .keep_joined(
            Some(connected),
            &meeting,
            std::slice::from_ref(&options),
            &stop,
            &report,
        )
        .await;
    entrance.close().await;
    result.map_err(Failure::Failed)
}

fn disconnected(out: &Output, who: &str, reason: &str, stats: &TunnelStats) {
    let (streams, failed) = (stats.streams.get(), stats.failed.get());
    let (up, down) = (stats.bytes_up.get(), stats.bytes_down.get());
    out.event(json!({
        "event": "disconnected", "peer": who, "reason": reason,
        "streams": streams, "failed": failed, "bytes_up": up, "bytes_down": down,
    }));
    out.say(&format!(
        "Peer {who} disconnected ({reason}); so far {streams} streams ({failed} failed), {} up, {} down",
        indicatif::HumanBytes(up),
        indicatif::HumanBytes(down)
    ));
}
