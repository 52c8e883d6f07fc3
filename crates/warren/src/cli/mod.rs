//! Quick tunnels and command-line overrides for the `warren` binary.
//!
//! * `warren expose PORT --to HOST:7000`: a client-declared service, built in code, that
//!   prints the public address the server gave it.
//! * `warren forward -l PORT -r HOST:7000 -t TARGET`: a forward service selecting the
//!   server's forward service by its target.
//! * `-x URL`, `-r`, `-l`, `-t`, `-p`: override a config file's values.
//! * [`files`]: `warren send` / `warren receive`.
//! * [`p2p`]: `warren p2p listen` / `warren p2p connect`.
//!
//! Secrets come from `WARREN_PSK` / `WARREN_TOKEN`, from `--psk-file` / `--token-file`, or
//! (with a warning: the value shows in `ps`) from `--psk` / `--token`. They are never logged.

pub mod cert;
pub mod files;
pub mod p2p;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use clap::Args;
use warren::config::proxy::ProxySetting;
use warren::config::{
    ClientConfig, ClientForward, ClientService, HostPort, ProxyProtocol, ServiceKind, UdpSettings,
};
use warren::crypto::secret::Secret;

/// Where a secret comes from, as the command line says.
#[derive(Debug, Clone, Args)]
pub struct SecretArgs {
    /// Read the PSK from this file (first line). Default: the WARREN_PSK environment variable.
    #[arg(long, value_name = "FILE")]
    pub psk_file: Option<PathBuf>,
    /// The PSK itself. Visible to every user in `ps`: prefer WARREN_PSK or --psk-file.
    #[arg(long, value_name = "PSK")]
    pub psk: Option<String>,
    /// Read the service token from this file. Default: the WARREN_TOKEN environment variable.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The token itself. Visible in `ps`: prefer WARREN_TOKEN or --token-file.
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Allow short secrets and a plaintext transport (testing only).
    #[arg(long)]
    pub insecure: bool,
}

/// Options every client command shares.
#[derive(Debug, Clone, Args)]
pub struct ClientOverrides {
    /// Reach the server through this proxy: socks5://user:pass@host:1080, http://host:3128 or env.
    #[arg(short = 'x', long = "proxy", value_name = "URL")]
    pub proxy: Option<String>,
    /// Try IPv6 first when the server's name resolves to both.
    #[arg(long)]
    pub prefer_ipv6: bool,
}

impl SecretArgs {
    /// The PSK and token from flags, files or the environment.
    ///
    /// # Errors
    /// A message saying which secret is missing or which file cannot be read.
    pub fn resolve(&self) -> Result<(Secret, Secret), String> {
        let psk = secret(
            "PSK",
            self.psk.as_deref(),
            self.psk_file.as_deref(),
            "WARREN_PSK",
            "--psk-file",
        )?;
        let token = secret(
            "token",
            self.token.as_deref(),
            self.token_file.as_deref(),
            "WARREN_TOKEN",
            "--token-file",
        )?;
        Ok((psk, token))
    }
}

/// The PSK alone, from `--psk-file` or `WARREN_PSK` (`warren send` / `warren receive`).
///
/// # Errors
/// A message saying the PSK is missing or the file cannot be read.
pub fn psk(psk_file: Option<&Path>) -> Result<Secret, String> {
    secret("PSK", None, psk_file, "WARREN_PSK", "--psk-file")
}

/// A service token alone, from `--token-file` or `WARREN_TOKEN` (`warren p2p --service`).
///
/// # Errors
/// A message saying the token is missing or the file cannot be read.
pub fn token(token_file: Option<&Path>) -> Result<Secret, String> {
    secret("token", None, token_file, "WARREN_TOKEN", "--token-file")
}

fn secret(
    what: &str,
    flag: Option<&str>,
    file: Option<&Path>,
    env: &str,
    file_flag: &str,
) -> Result<Secret, String> {
    if let Some(value) = flag {
        tracing::warn!(
            event = "secret_on_command_line",
            "the {what} was given on the command line, where other users can see it in `ps`; prefer {env} or {file_flag}"
        );
        return Ok(Secret::new(value));
    }
    if let Some(path) = file {
        let text = warren::config::read_text_file(path, warren::config::MAX_SECRET_FILE_LEN)
            .map_err(|e| format!("cannot read the {what} from {}: {e}", path.display()))?;
        let value = text.lines().next().unwrap_or_default().trim().to_owned();
        if value.is_empty() {
            return Err(format!(
                "{} is empty; put the {what} on its first line",
                path.display()
            ));
        }
        return Ok(Secret::new(value));
    }
    match std::env::var(env) {
        Ok(value) if !value.is_empty() => Ok(Secret::new(value)),
        _ => Err(format!(
            "no {what}: set {env}, or give {file_flag} FILE (the server's {})",
            if what == "PSK" {
                "psk"
            } else {
                "default_token or the service's token"
            }
        )),
    }
}

/// `PORT` or `HOST:PORT`; a bare port means 127.0.0.1.
pub fn local_target(text: &str) -> Result<HostPort, String> {
    if let Ok(port) = text.trim().parse::<u16>() {
        if port == 0 {
            return Err("port 0 is not a port you can connect to".into());
        }
        return Ok(HostPort {
            host: "127.0.0.1".into(),
            port,
        });
    }
    text.parse::<HostPort>()
        .map_err(|e| format!("invalid local service {text:?}: {e}; write PORT or HOST:PORT"))
}

/// `PORT` or `IP:PORT` to listen on; a bare port means 127.0.0.1.
pub fn listen_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.trim().parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    text.trim()
        .parse::<SocketAddr>()
        .map_err(|_| format!("invalid listen address {text:?}; write PORT, IP:PORT or [IPv6]:PORT"))
}

/// `HOST:PORT` of a server.
pub fn server_addr(text: &str) -> Result<HostPort, String> {
    text.parse::<HostPort>().map_err(|e| {
        format!("invalid server address {text:?}: {e}; write HOST:PORT, e.g. example.com:7000")
    })
}

/// A `-x` value.
pub fn proxy(text: &str) -> Result<ProxySetting, String> {
    text.parse::<ProxySetting>()
        .map_err(|e| format!("invalid proxy {text:?}: {e}"))
}

/// A `--proxy-protocol` value.
pub fn proxy_protocol(text: &str) -> Result<ProxyProtocol, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "v1" | "1" => Ok(ProxyProtocol::V1),
        "v2" | "2" => Ok(ProxyProtocol::V2),
        _ => Err(format!(
            "unknown PROXY protocol version {text:?}; use v1 or v2"
        )),
    }
}

/// Applies shared client overrides to a config.
pub fn apply_overrides(
    config: &mut ClientConfig,
    overrides: &ClientOverrides,
) -> Result<(), String> {
    if let Some(text) = &overrides.proxy {
        config.proxy = Some(proxy(text)?);
    }
    if overrides.prefer_ipv6 {
        config.prefer_ipv6 = true;
    }
    Ok(())
}

/// Name of the service `warren expose` declares.
pub const EXPOSE_SERVICE: &str = "expose";
/// Name of the service `warren forward` uses.
pub const FORWARD_SERVICE: &str = "forward";

/// The service kind of a quick tunnel: `--udp` or TCP.
pub fn protocol(udp: bool) -> ServiceKind {
    if udp {
        ServiceKind::Udp(UdpSettings::DEFAULT)
    } else {
        ServiceKind::Tcp
    }
}

/// What `warren http` asks for: `--subdomain` and/or `--host` names.
///
/// # Errors
/// Neither given, or a name that is not one.
pub fn http_claim(
    subdomain: Option<String>,
    hosts: Vec<String>,
) -> Result<warren::config::http::HttpClaim, String> {
    if subdomain.is_none() && hosts.is_empty() {
        return Err("say which name to publish: --subdomain NAME (under the server's subdomain_host) or --host NAME".to_owned());
    }
    let subdomain = subdomain.map(|s| s.trim().to_ascii_lowercase());
    if let Some(label) = &subdomain
        && !warren::config::http::is_dns_label(label)
    {
        return Err(format!(
            "--subdomain {label:?} is not one DNS label: letters, digits and inner hyphens, e.g. --subdomain app"
        ));
    }
    let mut names = Vec::new();
    for host in hosts {
        match warren::http::route::HostPattern::parse(&host) {
            Ok(warren::http::route::HostPattern::Exact(name)) => names.push(name),
            Ok(_) => return Err(format!("--host {host:?}: give exact names, not wildcards")),
            Err(error) => return Err(format!("--host {host:?}: {error}")),
        }
    }
    Ok(warren::config::http::HttpClaim {
        subdomain,
        hosts: names,
    })
}

/// The client config of `warren expose`.
#[allow(clippy::too_many_arguments)]
pub fn expose_config(
    server: HostPort,
    kind: ServiceKind,
    target: HostPort,
    remote_bind: SocketAddr,
    psk: Secret,
    token: Secret,
    proxy_protocol: Option<ProxyProtocol>,
    insecure: bool,
) -> ClientConfig {
    let mut config = ClientConfig::new(server, psk);
    config.insecure = insecure;
    config.default_token = Some(token.clone());
    config.services.insert(
        EXPOSE_SERVICE.to_owned(),
        ClientService {
            name: EXPOSE_SERVICE.to_owned(),
            kind,
            target,
            token,
            remote_bind: Some(remote_bind),
            proxy_protocol,
            weight: 1,
            health_check: None,
            http_claim: None,
            bandwidth_limit: None,
            compression: None,
        },
    );
    config
}

/// The client config of `warren forward`: by target (`-t`) or by service name.
#[allow(clippy::too_many_arguments)]
pub fn forward_config(
    server: HostPort,
    kind: ServiceKind,
    bind: SocketAddr,
    target: Option<HostPort>,
    service: Option<String>,
    psk: Secret,
    token: Secret,
    insecure: bool,
) -> ClientConfig {
    let mut config = ClientConfig::new(server, psk);
    config.insecure = insecure;
    config.default_token = Some(token.clone());
    let name = service.unwrap_or_else(|| FORWARD_SERVICE.to_owned());
    config.forwards.insert(
        name.clone(),
        ClientForward {
            name,
            kind,
            bind,
            target,
            token,
            bandwidth_limit: None,
            compression: None,
        },
    );
    config
}
