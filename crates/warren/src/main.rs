//! The `warren` command: a thin CLI over the `warren` library.

mod cli;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;
use tracing::error;
use warren::config::{Config, ConfigErrors};
use warren::{Client, Server};

const EXAMPLES: &str = "\
Examples:
  warren demo                      # try it: server, client and a web page on loopback
  warren keygen                    # print a fresh PSK and token
  warren server server.toml        # on the public machine
  warren client client.toml        # on the machine behind NAT
  warren check client.toml         # validate a config and exit
  warren doctor client.toml        # diagnose a setup: config, ports, targets, handshake
  warren ping client.toml -n 10    # connect / handshake / round-trip times to the server
  warren completions bash > /etc/bash_completion.d/warren
  warren send photos/ -r tunnel.example.com:7000   # prints a code; then on the other machine:
  warren receive -r tunnel.example.com:7000        # and type the code
  warren cert ca --out ca          # certificates for QUIC mtls (then cert server / cert client)
  WARREN_PSK=... WARREN_TOKEN=... warren expose 3000 --to tunnel.example.com:7000
  WARREN_PSK=... WARREN_TOKEN=... warren forward -l 5000 -r tunnel.example.com:7000 -t 10.0.0.5:80";

/// Warren: a fast, encrypted tunnel that exposes services behind NAT.
#[derive(Debug, Parser)]
#[command(name = "warren", version, about, after_help = EXAMPLES)]
struct Cli {
    /// Log level: error, warn, info, debug, trace (or a tracing filter such as `warren=debug`).
    #[arg(long, global = true, default_value = "info", env = "WARREN_LOG")]
    log_level: String,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Threads that run tunnels: 1 runs everything on one thread, which has the fewest
    /// wake-ups per hop (lowest latency); more spread busy streams over cores. Default: one
    /// per core.
    #[arg(long, global = true, env = "WARREN_WORKERS", value_name = "N")]
    workers: Option<std::num::NonZeroUsize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the public server: binds the server port and the service ports.
    #[command(
        after_help = "Example:\n  WARREN_PSK=... warren server server.toml\n\nSaving the file, SIGHUP (kill -HUP PID) or POST /api/v1/reload applies a changed config\nwithout a restart; an invalid file is refused and the running config kept."
    )]
    Server {
        /// Config file with a [server] section.
        #[arg(default_value = "warren.toml")]
        config: PathBuf,
        /// Override the port of the config's `bind` (clients connect here).
        #[arg(short = 'p', long = "port")]
        port: Option<u16>,
        /// On SIGTERM, how long streams in flight may take to finish (overrides the
        /// config's drain_timeout), e.g. 10s.
        #[arg(long, value_name = "DURATION", value_parser = drain_timeout)]
        drain_timeout: Option<std::time::Duration>,
    },
    /// Run the client behind NAT: connects to the server and serves local targets.
    #[command(
        after_help = "Example:\n  WARREN_PSK=... warren client client.toml\n\nSaving the file, SIGHUP (kill -HUP PID) or POST /api/v1/reload applies a changed config\nwithout a restart; an invalid file is refused and the running config kept."
    )]
    Client {
        /// Config file with a [client] section.
        #[arg(default_value = "warren.toml")]
        config: PathBuf,
        /// Override the config's `server` (HOST:PORT).
        #[arg(short = 'r', long = "remote", value_name = "HOST:PORT")]
        server: Option<String>,
        /// Override the `bind` of the config's only forward service.
        #[arg(short = 'l', long = "local", value_name = "[IP:]PORT")]
        local: Option<String>,
        /// Override the `target` of the config's only forward service.
        #[arg(short = 't', long = "target", value_name = "HOST:PORT")]
        target: Option<String>,
        /// On SIGTERM, how long streams in flight may take to finish (overrides the
        /// config's drain_timeout), e.g. 10s.
        #[arg(long, value_name = "DURATION", value_parser = drain_timeout)]
        drain_timeout: Option<std::time::Duration>,
        #[command(flatten)]
        overrides: cli::ClientOverrides,
    },
    /// Expose a local port through a server, no config file (the server needs allow_ports).
    #[command(
        after_help = "Example:\n  WARREN_PSK=... WARREN_TOKEN=... warren expose 3000 --to tunnel.example.com:7000"
    )]
    Expose {
        /// The local service: PORT (on 127.0.0.1) or HOST:PORT.
        local: String,
        /// The server, HOST:PORT.
        #[arg(long = "to", short = 'r', value_name = "HOST:PORT")]
        to: String,
        /// Ask for this public port (default: any port the server allows).
        #[arg(long)]
        remote_port: Option<u16>,
        /// Ask for this public IP at the server (default: the server's choice).
        #[arg(long, value_name = "IP")]
        remote_addr: Option<IpAddr>,
        /// Send a PROXY protocol header (v1 or v2) to the local service.
        #[arg(long, value_name = "VERSION")]
        proxy_protocol: Option<String>,
        /// Carry UDP datagrams instead of TCP (DNS, games, WireGuard, ...).
        #[arg(long)]
        udp: bool,
        #[command(flatten)]
        secrets: cli::SecretArgs,
        #[command(flatten)]
        overrides: cli::ClientOverrides,
    },
    /// Publish a local web service at a host name on a server's HTTP port (ngrok style), no
    /// config file. The server needs [server.http] with subdomain_host or allow_hosts.
    #[command(
        after_help = "Example:\n  WARREN_PSK=... WARREN_TOKEN=... warren http 3000 --to tunnel.example.com:7000 --subdomain app\n  (prints the public URL, e.g. http://app.tunnel.example.com/)"
    )]
    Http {
        /// The local web service: PORT (on 127.0.0.1) or HOST:PORT.
        local: String,
        /// The server, HOST:PORT.
        #[arg(long = "to", short = 'r', value_name = "HOST:PORT")]
        to: String,
        /// Ask for NAME.<the server's subdomain_host>.
        #[arg(long, value_name = "NAME")]
        subdomain: Option<String>,
        /// Ask for this host name (the server's allow_hosts must allow it); repeat for several.
        #[arg(long = "host", value_name = "NAME")]
        hosts: Vec<String>,
        #[command(flatten)]
        secrets: cli::SecretArgs,
        #[command(flatten)]
        overrides: cli::ClientOverrides,
    },
    /// Reach a target through a server (ssh -L style), no config file. The server's config
    /// must name the target as a forward service.
    #[command(
        after_help = "Example:\n  WARREN_PSK=... WARREN_TOKEN=... warren forward -l 5000 -r tunnel.example.com:7000 -t 10.0.0.5:80"
    )]
    Forward {
        /// Where to listen: PORT (on 127.0.0.1) or IP:PORT.
        #[arg(short = 'l', long = "local", value_name = "[IP:]PORT")]
        local: String,
        /// The server, HOST:PORT.
        #[arg(short = 'r', long = "remote", value_name = "HOST:PORT")]
        remote: String,
        /// The target, exactly as the server's forward service names it.
        #[arg(
            short = 't',
            long = "target",
            value_name = "HOST:PORT",
            required_unless_present = "service"
        )]
        target: Option<String>,
        /// Select the server's forward service by name instead of by target.
        #[arg(long, value_name = "NAME")]
        service: Option<String>,
        /// Carry UDP datagrams instead of TCP (the server's forward service must be UDP too).
        #[arg(long)]
        udp: bool,
        #[command(flatten)]
        secrets: cli::SecretArgs,
        #[command(flatten)]
        overrides: cli::ClientOverrides,
    },
    /// Print a strong random PSK and token for new configs.
    #[command(after_help = "Example:\n  warren keygen >> secrets.env")]
    Keygen,
    /// Validate a config file; exit 0 when valid, 1 with every problem listed when not.
    #[command(after_help = "Example:\n  warren check server.toml")]
    Check {
        /// The config file.
        config: PathBuf,
    },
    /// Diagnose a setup: config, secrets, clock, ports, name resolution, targets, a full
    /// handshake with the server, and this machine's cipher speeds. Exit 1 on any failure.
    #[command(
        after_help = "Examples:\n  warren doctor client.toml\n  warren doctor server.toml --format json"
    )]
    Doctor {
        /// Config file (server or client, detected from its section).
        #[arg(default_value = "warren.toml")]
        config: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Measure connect, handshake and round-trip times to a server over N probes.
    #[command(
        after_help = "Examples:\n  warren ping client.toml\n  WARREN_PSK=... warren ping -r tunnel.example.com:7000 -n 20\n  warren ping -r 127.0.0.1:7000 --psk-file /etc/warren/psk"
    )]
    Ping {
        /// Config file (client: its server; server: its own port on this machine).
        #[arg(required_unless_present = "remote", conflicts_with = "remote")]
        config: Option<PathBuf>,
        /// The server to ping instead of a config's (needs WARREN_PSK or --psk-file).
        #[arg(short = 'r', long = "remote", value_name = "HOST:PORT")]
        remote: Option<String>,
        /// File holding the PSK (with --remote; else WARREN_PSK is used).
        #[arg(long, value_name = "FILE")]
        psk_file: Option<PathBuf>,
        /// Number of probes.
        #[arg(short = 'n', long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
        count: u32,
        /// Pause between probes, in milliseconds.
        #[arg(long, default_value_t = 200)]
        interval_ms: u64,
    },
    /// Make development certificates: a CA, then server certificates (QUIC mtls, HTTPS
    /// services with tls = "terminate") and client certificates (QUIC mtls) signed by it.
    #[command(
        after_help = "Examples:\n  warren cert ca --out ca\n  warren cert server --ca ca --name tunnel.example.com --out server\n  warren cert client --ca ca --name laptop --out laptop"
    )]
    Cert {
        #[command(subcommand)]
        command: cli::cert::CertCommand,
    },
    /// Send files and folders to another machine, peer to peer through NATs: prints a code
    /// to give the receiver. Needs a Warren server with [server.p2p] and its PSK, or --lan
    /// when both machines are on one local network.
    #[command(
        after_help = "Examples:\n  WARREN_PSK=... warren send photos/ notes.txt --server tunnel.example.com:7000\n  warren send big.iso --max-receivers 3 --exclude '*.tmp'\n  warren send photos/ --lan     # no server: the receiver runs `warren receive --lan`\n\nWARREN_SERVER and WARREN_PSK stand in for --server and the PSK (--lan ignores them)."
    )]
    Send {
        #[command(flatten)]
        args: cli::files::SendArgs,
    },
    /// Receive what `warren send` offers: type the code it printed.
    #[command(
        after_help = "Examples:\n  WARREN_PSK=... warren receive --server tunnel.example.com:7000     # then type the code\n  WARREN_CODE=1234-acid-acorn-acre warren receive --out downloads --yes\n  warren receive --lan     # the sender ran `warren send --lan` on this network\n\nRunning the same transfer again resumes it."
    )]
    Receive {
        #[command(flatten)]
        args: cli::files::ReceiveArgs,
    },
    /// Peer-to-peer tunnels: reach a TCP or UDP service behind another NAT with a code,
    /// directly when the NATs allow (else through the server's relay).
    #[command(
        after_help = "Examples:\n  WARREN_PSK=... warren p2p listen --tcp 127.0.0.1:22 --server tunnel.example.com:7000\n  WARREN_PSK=... warren p2p connect --bind 127.0.0.1:2222 --server tunnel.example.com:7000   # then type the code"
    )]
    P2p {
        #[command(subcommand)]
        command: cli::p2p::P2pCommand,
    },
    /// Print a shell completion script.
    #[command(
        after_help = "Examples:\n  warren completions bash > /etc/bash_completion.d/warren\n  warren completions zsh > \"${fpath[1]}/_warren\"\n  warren completions fish > ~/.config/fish/completions/warren.fish"
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Start a server, a client and a local web page on loopback, tunnelled end to end.
    #[command(after_help = "Example:\n  warren demo            # then open the printed URL")]
    Demo {
        /// Public port to try for the demo page (any free port if taken).
        #[arg(long, default_value_t = 8080)]
        port: u16,
    },
}

/// The async runtime: one thread for `--workers 1` (no cross-thread wake-ups at all), else
/// a work-stealing pool of that many workers (one per core by default).
fn build_runtime(
    workers: Option<std::num::NonZeroUsize>,
) -> std::io::Result<tokio::runtime::Runtime> {
    match workers.map(std::num::NonZeroUsize::get) {
        Some(1) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
        None => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    }
}

/// How `main` ends: maps to the documented exit codes.
enum Outcome {
    /// Exit 0.
    Clean,
    /// Exit 1: a runtime failure.
    Failed,
    /// Exit 2: bad configuration or usage.
    BadConfig,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `warren send --lan` runs the server's mailbox in process: its start, stop and
    // session lines are not news to the user at the default level.
    let log_level = match &cli.command {
        Command::Send { args } if args.lan && cli.log_level == "info" => {
            "info,warren::server=warn".to_owned()
        }
        _ => cli.log_level.clone(),
    };
    if let Err(message) = init_logging(&log_level, cli.log_format) {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    raise_open_file_limit();
    let runtime = match build_runtime(cli.workers) {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    if let Command::Completions { shell } = cli.command {
        use clap::CommandFactory;
        let mut command = Cli::command();
        clap_complete::generate(shell, &mut command, "warren", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    match runtime.block_on(run(cli.command)) {
        Outcome::Clean => ExitCode::SUCCESS,
        Outcome::Failed => ExitCode::from(1),
        Outcome::BadConfig => ExitCode::from(2),
    }
}

/// Every tunnelled connection costs two descriptors on each side: raise the soft limit to
/// the hard limit, and say so when even that is low.
fn raise_open_file_limit() {
    const LOW: u64 = 4096;
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) if limit < LOW => tracing::warn!(
            event = "fd_limit_low",
            limit,
            "the open-file limit is {limit}; each tunnelled connection needs 2 per side. Raise it (e.g. `ulimit -n 65536` or LimitNOFILE= in systemd)"
        ),
        Ok(limit) => tracing::debug!(event = "fd_limit", limit, "open-file limit raised"),
        Err(error) => {
            tracing::warn!(event = "fd_limit_failed", %error, "could not raise the open-file limit")
        }
    }
}

fn init_logging(level: &str, format: LogFormat) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(level).map_err(|e| {
        format!("invalid --log-level `{level}`: {e}; use error, warn, info, debug or trace")
    })?;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // Stderr for the operator, and the same events (after the same filter) in the ring the
    // dashboard's Logs page reads.
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(warren::admin::logs::layer());
    match format {
        LogFormat::Text => registry.with(stderr).init(),
        LogFormat::Json => registry.with(stderr.json()).init(),
    }
    Ok(())
}

async fn run(command: Command) -> Outcome {
    match command {
        Command::Keygen => {
            println!("psk = \"{}\"", warren::demo::random_secret());
            println!("default_token = \"{}\"", warren::demo::random_secret());
            Outcome::Clean
        }
        Command::Check { config } => match load(&config) {
            Ok(Config::Server(server)) => {
                println!(
                    "{}: valid server config ({} services)",
                    config.display(),
                    server.services.len()
                );
                Outcome::Clean
            }
            Ok(Config::Client(client)) => {
                println!(
                    "{}: valid client config ({} services)",
                    config.display(),
                    client.services.len()
                );
                Outcome::Clean
            }
            Err(errors) => {
                eprintln!("{errors}");
                Outcome::Failed
            }
        },
        Command::Server {
            config,
            port,
            drain_timeout,
        } => {
            // The flags, applied to the file and again to each reload of it.
            let flags = move |server: &mut warren::ServerConfig| {
                if let Some(port) = port {
                    server.bind.set_port(port);
                }
                if let Some(timeout) = drain_timeout {
                    server.drain_timeout = timeout;
                }
            };
            let server_config = match load(&config) {
                Ok(Config::Server(mut server)) => {
                    flags(&mut server);
                    server
                }
                Ok(Config::Client(_)) => return wrong_kind(&config, "server", "client"),
                Err(errors) => return bad_config(errors),
            };
            let server = match Server::from_config(server_config) {
                Ok(server) => server,
                Err(errors) => return bad_config(errors),
            };
            let bound = match server.bind().await {
                Ok(bound) => bound,
                Err(error) => {
                    error!(event = "server_failed", %error, "the server could not start");
                    return Outcome::Failed;
                }
            };
            // A reload reads the file again and re-applies the same flags.
            let source = warren::ConfigSource::new(config, move |path| {
                let mut server = warren::ServerConfig::load(path)?;
                flags(&mut server);
                Ok(server)
            });
            let bound = bound.reload_from(source);
            tokio::spawn(drain_on_signal(bound.drain_token(), bound.shutdown_token()));
            bound.run().await;
            Outcome::Clean
        }
        Command::Client {
            config,
            server,
            local,
            target,
            drain_timeout,
            overrides,
        } => {
            let mut client_config = match load(&config) {
                Ok(Config::Client(client)) => client,
                Ok(Config::Server(_)) => return wrong_kind(&config, "client", "server"),
                Err(errors) => return bad_config(errors),
            };
            let flags = ClientFlags {
                server,
                local,
                target,
                drain_timeout,
                overrides,
            };
            if let Err(message) = flags.apply(&mut client_config) {
                return usage_error(&message);
            }
            // A reload reads the file again and re-applies the same flags.
            let source = warren::ConfigSource::new(config, move |path| {
                let mut client = warren::ClientConfig::load(path)?;
                flags
                    .apply(&mut client)
                    .map_err(|message| ConfigErrors::Invalid {
                        source_name: Some(path.display().to_string()),
                        errors: vec![warren::config::ConfigError::new("", message)],
                    })?;
                Ok(client)
            });
            run_client(client_config, None, Some(source)).await
        }
        Command::Expose {
            local,
            to,
            remote_port,
            remote_addr,
            proxy_protocol,
            udp,
            secrets,
            overrides,
        } => {
            let built = (|| -> Result<_, String> {
                let target = cli::local_target(&local)?;
                let server = cli::server_addr(&to)?;
                let (psk, token) = secrets.resolve()?;
                let version = proxy_protocol
                    .as_deref()
                    .map(cli::proxy_protocol)
                    .transpose()?;
                let remote_bind = SocketAddr::new(
                    remote_addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
                    remote_port.unwrap_or(0),
                );
                let mut config = cli::expose_config(
                    server,
                    cli::protocol(udp),
                    target.clone(),
                    remote_bind,
                    psk,
                    token,
                    version,
                    secrets.insecure,
                );
                cli::apply_overrides(&mut config, &overrides)?;
                Ok((config, target))
            })();
            match built {
                Ok((config, target)) => run_client(config, Some(target), None).await,
                Err(message) => usage_error(&message),
            }
        }
        Command::Http {
            local,
            to,
            subdomain,
            hosts,
            secrets,
            overrides,
        } => {
            let built = (|| -> Result<_, String> {
                let target = cli::local_target(&local)?;
                let server = cli::server_addr(&to)?;
                let (psk, token) = secrets.resolve()?;
                let claim = cli::http_claim(subdomain, hosts)?;
                let mut config = cli::expose_config(
                    server,
                    warren::config::ServiceKind::Http,
                    target.clone(),
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
                    psk,
                    token,
                    None,
                    secrets.insecure,
                );
                if let Some(service) = config.services.get_mut(cli::EXPOSE_SERVICE) {
                    service.remote_bind = None;
                    service.http_claim = Some(claim);
                }
                cli::apply_overrides(&mut config, &overrides)?;
                Ok((config, target))
            })();
            match built {
                Ok((config, target)) => run_client(config, Some(target), None).await,
                Err(message) => usage_error(&message),
            }
        }
        Command::Forward {
            local,
            remote,
            target,
            service,
            udp,
            secrets,
            overrides,
        } => {
            let built = (|| -> Result<_, String> {
                let bind = cli::listen_addr(&local)?;
                let server = cli::server_addr(&remote)?;
                let target = target.as_deref().map(|t| {
                    t.parse::<warren::HostPort>()
                        .map_err(|e| format!("invalid target {t:?}: {e}; write HOST:PORT as the server's config names it"))
                });
                let target = target.transpose()?;
                let (psk, token) = secrets.resolve()?;
                let mut config = cli::forward_config(
                    server,
                    cli::protocol(udp),
                    bind,
                    target,
                    service,
                    psk,
                    token,
                    secrets.insecure,
                );
                cli::apply_overrides(&mut config, &overrides)?;
                Ok(config)
            })();
            match built {
                Ok(config) => run_client(config, None, None).await,
                Err(message) => usage_error(&message),
            }
        }
        Command::Demo { port } => demo(port).await,
        Command::Doctor { config, format } => {
            let report = warren::doctor::diagnose(&config).await;
            match format {
                OutputFormat::Text => print!("{}", report.to_text()),
                OutputFormat::Json => println!("{}", report.to_json()),
            }
            if report.failed() {
                Outcome::Failed
            } else {
                Outcome::Clean
            }
        }
        Command::Ping {
            config,
            remote,
            psk_file,
            count,
            interval_ms,
        } => ping(config, remote, psk_file, count, interval_ms).await,
        Command::Cert { command } => match cli::cert::run(command) {
            Ok(report) => {
                print!("{report}");
                Outcome::Clean
            }
            Err(message) => {
                eprintln!("error: {message}");
                Outcome::Failed
            }
        },
        Command::Send { args } => files_outcome(cli::files::send(args).await),
        Command::Receive { args } => files_outcome(cli::files::receive(args).await),
        Command::P2p { command } => {
            let stop = CancellationToken::new();
            tokio::spawn(stop_on_signal(stop.clone()));
            files_outcome(cli::p2p::run(command, stop).await)
        }
        Command::Completions { .. } => Outcome::Clean,
    }
}

/// Exit code and message of `warren send` / `warren receive` / `warren p2p`.
fn files_outcome(result: Result<(), cli::files::Failure>) -> Outcome {
    match result {
        Ok(()) => Outcome::Clean,
        Err(cli::files::Failure::Usage(message)) => {
            eprintln!("error: {message}");
            Outcome::BadConfig
        }
        Err(cli::files::Failure::Failed(message)) => {
            eprintln!("error: {message}");
            Outcome::Failed
        }
    }
}

async fn ping(
    config: Option<PathBuf>,
    remote: Option<String>,
    psk_file: Option<PathBuf>,
    count: u32,
    interval_ms: u64,
) -> Outcome {
    let targets = match ping_targets(config, remote, psk_file) {
        Ok(targets) => targets,
        Err(message) => {
            eprintln!("error: {message}");
            return Outcome::BadConfig;
        }
    };
    let mut outcome = Outcome::Clean;
    for (i, target) in targets.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!("PING {} ({} probes)", target.server, count);
        let mut probes = Vec::new();
        for seq in 1..=u64::from(count) {
            match warren::ping::probe(target, seq).await {
                Ok(probe) => {
                    println!(
                        "probe {seq}: connect {}, handshake {}, rtt {} ({})",
                        warren::doctor::ms(probe.connect),
                        warren::doctor::ms(probe.handshake),
                        warren::doctor::ms(probe.rtt),
                        probe.cipher
                    );
                    probes.push(probe);
                }
                Err(error) => println!("probe {seq}: failed: {error}"),
            }
            if seq < u64::from(count) {
                tokio::time::sleep(std::time::Duration::from_millis(interval_ms)).await;
            }
        }
        print!("{}", warren::ping::summary(&probes, count as usize));
        if probes.is_empty() {
            outcome = Outcome::Failed;
        }
    }
    outcome
}

/// Where `warren ping` goes: a client config's servers (every one), a server config's own
/// port, or `-r` with a PSK from a file or the environment.
fn ping_targets(
    config: Option<PathBuf>,
    remote: Option<String>,
    psk_file: Option<PathBuf>,
) -> Result<Vec<warren::ping::PingTarget>, String> {
    use warren::config::{HostPort, Transport, has_aes_hardware};
    use warren::crypto::secret::Secret;
    let transport_ciphers =
        |transport: Transport, ciphers: Vec<warren::CipherSuite>| match transport {
            Transport::Tcp => vec![warren::CipherSuite::None],
            _ => ciphers,
        };
    if let Some(remote) = remote {
        let server: HostPort = remote
            .parse()
            .map_err(|e| format!("invalid --remote {remote:?}: {e}; write HOST:PORT"))?;
        let psk = match psk_file {
            Some(path) => {
                warren::config::read_text_file(&path, warren::config::MAX_SECRET_FILE_LEN)
                    .map_err(|e| format!("cannot read --psk-file {}: {e}", path.display()))?
            }
            .trim()
            .to_owned(),
            None => std::env::var("WARREN_PSK").map_err(|_| {
                "--remote needs the PSK: set WARREN_PSK or pass --psk-file FILE".to_owned()
            })?,
        };
        return Ok(vec![warren::ping::PingTarget {
            server,
            psk: Secret::new(psk),
            ciphers: warren::CipherSuite::default_preference(has_aes_hardware()),
            cipher_choice: warren::CipherChoice::default(),
            deadline: warren::config::DEFAULT_HANDSHAKE_TIMEOUT,
            quic: None,
        }]);
    }
    let path = config.unwrap_or_else(|| PathBuf::from("warren.toml"));
    match load(&path).map_err(|e| e.to_string())? {
        Config::Client(client) => {
            let ciphers = transport_ciphers(client.transport, client.ciphers.clone());
            Ok(client
                .servers()
                .into_iter()
                .map(|server| warren::ping::PingTarget {
                    server: server.clone(),
                    psk: client.psk.clone(),
                    ciphers: ciphers.clone(),
                    cipher_choice: client.cipher_choice,
                    deadline: client.handshake_timeout,
                    quic: (client.transport == warren::config::Transport::Quic)
                        .then(|| client.quic.clone()),
                })
                .collect())
        }
        Config::Server(server) => {
            let mut addr = server.bind;
            if addr.ip().is_unspecified() {
                addr.set_ip(if addr.is_ipv4() {
                    std::net::Ipv4Addr::LOCALHOST.into()
                } else {
                    std::net::Ipv6Addr::LOCALHOST.into()
                });
            }
            Ok(vec![warren::ping::PingTarget {
                server: HostPort::from(addr),
                psk: server.psk,
                ciphers: transport_ciphers(server.transport, server.ciphers),
                cipher_choice: server.cipher_choice,
                deadline: server.handshake_timeout,
                // The server's own QUIC settings, as a client of it: psk mode needs only
                // the PSK (the pin is optional); mtls needs a client certificate.
                quic: (server.transport == warren::config::Transport::Quic).then(|| {
                    warren::config::quic::QuicConfig {
                        auth: warren::config::quic::QuicAuth::Psk {
                            cert: None,
                            pin: None,
                        },
                        ..server.quic.clone()
                    }
                }),
            }])
        }
    }
}

/// The flags of `warren client` that override its config file (kept to re-apply them on
/// every reload).
struct ClientFlags {
    server: Option<String>,
    local: Option<String>,
    target: Option<String>,
    drain_timeout: Option<std::time::Duration>,
    overrides: cli::ClientOverrides,
}

impl ClientFlags {
    /// Applies `-r`, `-l`, `-t`, `-x` to a loaded client config.
    fn apply(&self, config: &mut warren::ClientConfig) -> Result<(), String> {
        if let Some(timeout) = self.drain_timeout {
            config.drain_timeout = timeout;
        }
        if let Some(server) = &self.server {
            // `-r` names the one server to use, instead of the file's list.
            config.server = cli::server_addr(server)?;
            config.more_servers.clear();
        }
        if self.local.is_some() || self.target.is_some() {
            let mut forwards = config.forwards.values_mut();
            let (Some(forward), None) = (forwards.next(), forwards.next()) else {
                return Err(
                    "-l and -t change the config's forward service, and it must have exactly one"
                        .into(),
                );
            };
            if let Some(local) = &self.local {
                forward.bind = cli::listen_addr(local)?;
            }
            if let Some(target) = &self.target {
                forward.target = Some(
                    target
                        .parse()
                        .map_err(|e| format!("invalid target {target:?}: {e}"))?,
                );
            }
        }
        cli::apply_overrides(config, &self.overrides)
    }
}

/// Runs a client; for `warren expose`, prints the public address once the server bound it.
async fn run_client(
    config: warren::ClientConfig,
    exposing: Option<warren::HostPort>,
    source: Option<warren::ConfigSource<warren::ClientConfig>>,
) -> Outcome {
    let server_host = config.server.host.clone();
    let scheme = match config.services.get(cli::EXPOSE_SERVICE).map(|s| s.kind) {
        Some(warren::config::ServiceKind::Udp(_)) => "udp://",
        _ => "",
    };
    let client = match Client::from_config(config) {
        Ok(client) => client,
        Err(errors) => return bad_config(errors),
    };
    let client = match source {
        Some(source) => client.reload_from(source),
        None => client,
    };
    let cancel = CancellationToken::new();
    let drain = CancellationToken::new();
    if exposing.is_some() {
        // A one-liner in a terminal stops at once, as ngrok does.
        tokio::spawn(stop_on_signal(cancel.clone()));
    } else {
        tokio::spawn(drain_on_signal(drain.clone(), cancel.clone()));
    }
    if let Some(local) = exposing {
        let mut status = client.status();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let mut shown = None;
            let mut shown_urls: Vec<String> = Vec::new();
            loop {
                let bound = status
                    .borrow_and_update()
                    .bound
                    .get(cli::EXPOSE_SERVICE)
                    .copied();
                let urls = status
                    .borrow()
                    .urls
                    .get(cli::EXPOSE_SERVICE)
                    .cloned()
                    .unwrap_or_default();
                if !urls.is_empty() && shown_urls != urls {
                    println!("Forwarding {} -> http://{local}", urls.join(" "));
                    use std::io::Write;
                    let _ = std::io::stdout().flush();
                    shown_urls = urls;
                }
                if let Some(addr) = bound.filter(|addr| Some(*addr) != shown) {
                    let host = if addr.ip().is_unspecified() {
                        warren::HostPort {
                            host: server_host.clone(),
                            port: addr.port(),
                        }
                    } else {
                        warren::HostPort::from(addr)
                    };
                    println!("Exposed {scheme}{local} at {scheme}{host}");
                    use std::io::Write;
                    let _ = std::io::stdout().flush();
                    shown = Some(addr);
                }
                tokio::select! {
                    () = cancel.cancelled() => return,
                    changed = status.changed() => if changed.is_err() { return },
                }
            }
        });
    }
    match client.run_draining(drain, cancel).await {
        Ok(()) => Outcome::Clean,
        Err(error) => {
            error!(event = "client_failed", %error, "the client stopped");
            Outcome::Failed
        }
    }
}

fn usage_error(message: &str) -> Outcome {
    eprintln!("error: {message}");
    Outcome::BadConfig
}

fn load(path: &Path) -> Result<Config, ConfigErrors> {
    Config::load(path)
}

fn bad_config(errors: ConfigErrors) -> Outcome {
    eprintln!("{errors}");
    Outcome::BadConfig
}

fn wrong_kind(path: &Path, wanted: &str, found: &str) -> Outcome {
    eprintln!(
        "error: {} is a {found} config (it has a [{found}] section); run `warren {found} {}` or give a file with a [{wanted}] section",
        path.display(),
        path.display()
    );
    Outcome::BadConfig
}

async fn demo(port: u16) -> Outcome {
    let demo = match warren::demo::Demo::start(port).await {
        Ok(demo) => demo,
        Err(error) => {
            error!(event = "demo_failed", %error, "the demo could not start");
            return Outcome::Failed;
        }
    };
    println!();
    println!("  Warren demo is running: a server, a client and a local web service, on loopback.");
    println!();
    println!("  Open {}", demo.url);
    println!();
    println!(
        "  The page is served by {} and reaches you through an encrypted",
        demo.local_addr
    );
    println!(
        "  Warren session ({}) via the server at {}.",
        demo.cipher, demo.server_addr
    );
    println!();
    println!("  To split it across two machines, run on the public one:");
    println!("      warren keygen > secrets    # then put the values in both configs");
    println!("      warren server examples/server.toml");
    println!("  and on the machine behind NAT (server = \"PUBLIC-HOST:7000\"):");
    println!("      warren client examples/client.toml");
    println!();
    println!("  Press Ctrl-C to stop.");
    let cancel = CancellationToken::new();
    stop_on_signal(cancel.clone()).await;
    demo.stop().await;
    Outcome::Clean
}

/// `--drain-timeout`: a duration such as `10s`.
fn drain_timeout(text: &str) -> Result<std::time::Duration, String> {
    warren::config::duration::parse_duration(text)
        .map_err(|error| format!("{error} (write e.g. --drain-timeout 10s)"))
}

/// A long-running client's or server's signals: SIGTERM drains (`drain`: no new visitors
/// come, streams in flight finish), a second SIGTERM or a SIGINT stops at once (`cancel`).
async fn drain_on_signal(drain: CancellationToken, cancel: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {
                    tracing::info!(event = "shutdown_requested", "SIGTERM: draining before stopping; send it again to stop at once");
                    drain.cancel();
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = term.recv() => {}
                        () = cancel.cancelled() => return,
                    }
                }
            }
            tracing::info!(event = "shutdown_requested", "shutting down");
            cancel.cancel();
            return;
        }
    }
    let _ = &drain;
    stop_on_signal(cancel).await;
}

/// Cancels `cancel` on SIGINT or SIGTERM.
async fn stop_on_signal(cancel: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                cancel.cancel();
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
    tracing::info!(event = "shutdown_requested", "shutting down");
    cancel.cancel();
}
