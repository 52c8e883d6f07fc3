//! Warren: a fast, encrypted tunnel.
//!
//! A public [`Server`] exposes services that live behind NAT with a [`Client`]: visitors
//! connect to the server's service ports, and their bytes travel over an authenticated,
//! encrypted session to the client, which dials the real service.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tokio_util::sync::CancellationToken;
//!
//! let server = warren::Server::builder()
//!     .bind("127.0.0.1:7000".parse()?)
//!     .psk("correct-horse-battery-staple-psk")
//!     .default_token("a-long-random-service-token")
//!     .tcp_service("web", "127.0.0.1:8080".parse()?)
//!     .build()?
//!     .bind()
//!     .await?;
//! tokio::spawn(server.run());
//!
//! let client = warren::Client::builder("127.0.0.1:7000".parse()?)
//!     .psk("correct-horse-battery-staple-psk")
//!     .default_token("a-long-random-service-token")
//!     .tcp_service("web", "127.0.0.1:3000".parse()?)
//!     .build()?;
//! client.run(CancellationToken::new()).await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! * [`config`]: the TOML file model and the typed config.
//! * [`crypto`]: record layer, key schedule, secrets.
//! * [`transport`]: TCP channels, preambles, records over sockets.
//! * [`session`]: the control channel (hello, heartbeats) and datagram channels.
//! * [`relay`]: byte pumps between local sockets and channels; UDP flow tables.
//! * [`server`], [`client`]: the two sides.
//! * [`p2p`]: peer-to-peer file transfer: join codes, PAKE, chunk hashes, resume, safe writes.
//! * [`http`]: HTTP services: host and path routing, middleware.
//! * [`demo`]: the self-contained `warren demo`.
//! * [`doctor`], [`ping`]: `warren doctor` and `warren ping`.
//! * [`metrics`], [`admin`]: Prometheus metrics, live connections and the admin HTTP API.
//! * [`reload`]: hot reload (SIGHUP, file changes, the admin API).

pub mod admin;
mod builder;
pub mod client;
pub mod config;
pub mod crypto;
pub mod demo;
pub mod doctor;
pub mod drain;
pub mod http;
pub mod metrics;
pub mod p2p;
pub mod ping;
pub mod relay;
pub mod reload;
pub mod server;
pub mod session;
pub mod transport;

pub use client::{Client, ClientBuilder, ClientError, ClientStatus};
pub use config::proxy::{PortRange, ProxySetting};
pub use config::{ClientConfig, Config, HostPort, ProxyProtocol, ServerConfig, UdpSettings};
pub use relay::udp::UdpStatsSnapshot;
pub use reload::{ConfigSource, ReloadError, ReloadSummary, Reloader};
pub use server::{BoundServer, Server, ServerBuilder, ServerError, UdpStatsHandle};
pub use transport::compress::Codec;
pub use warren_proto::{CipherChoice, CipherSuite};

/// Which end of a session a piece of code runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The public server.
    Server,
    /// The client behind NAT.
    Client,
}
