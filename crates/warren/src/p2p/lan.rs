//! `--lan`: a transfer between two machines on one local network, with no Warren server.
//!
//! The sender is its own mailbox: [`LanMailbox::start`] runs, in process, the server's
//! `[server.p2p]` part (the mailbox and the address reflector; no relay, no services) on
//! an ephemeral port of every IPv4 interface, with a fresh random PSK. The sender takes its
//! nameplate there as it would at any server, then [`LanMailbox::advertise`]s it with mDNS
//! (RFC 6762 / 6763 DNS-SD): service type [`SERVICE_TYPE`], instance `warren-<nameplate>`
//! ([`instance_name`]), the mailbox's TCP port, and a TXT record ([`Advert::txt`]) with the
//! protocol version, the nameplate and the mailbox's PSK. The receiver [`find`]s the
//! instance whose nameplate is its code's and joins that mailbox as usual: the key
//! exchange, key confirmation, the sealed fingerprints and the pinned QUIC are the ones
//! every transfer runs; only where the mailbox lives differs.
//!
//! ```text
//! sender                                                  receiver
//!   LanMailbox::start (127.0.0.1 + LAN, PSK p)
//!   allocate nameplate N, show N-w1-w2-w3
//!   advertise warren-N  {v=1, nameplate=N, psk=p} ─mDNS─▶ find(N): browse, resolve
//!   mailbox ◀──────────────────────── claim N, PAKE, PathOffer (host candidates)
//!   connectivity checks ◀──────────── direct ──────────▶ connectivity checks, QUIC
//! ```
//!
//! What the LAN learns: mDNS reveals the nameplate and the mailbox's PSK, never the code's
//! words. Publishing the PSK is deliberate: the mailbox is untrusted by design (it only
//! passes the PAKE's messages, which are useless without the words), so the PSK only lets
//! hosts on this network use this one short-lived mailbox, as they could use any server's
//! with its PSK. A host that answers mDNS for our nameplate in the sender's place gets a
//! failed key exchange, never the files.
//!
//! Only IPv4 is advertised and browsed (the mailbox listens on `0.0.0.0`). The mDNS
//! daemon (a thread of `mdns-sd`) lives as long as its [`Advertising`] or one [`find`];
//! both shut it down when done or dropped, and every wait on it is bounded.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use mdns_sd::{IfKind, ResolvedService, ServiceDaemon, ServiceEvent, ServiceInfo};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::code::Nameplate;
use super::mailbox::MailboxServer;
use crate::config::HostPort;
use crate::config::p2p::P2pConfig;
use crate::crypto::hex;
use crate::crypto::secret::Secret;

/// The DNS-SD service type of a sender's mailbox (`_tcp`: the advertised port is the
/// mailbox's TCP port; the reflector's UDP port comes from the mailbox as usual).
pub const SERVICE_TYPE: &str = "_warren-send._tcp.local.";
/// The TXT record's protocol version: a receiver refuses an advert of another.
pub const PROTOCOL_VERSION: &str = "1";
/// How long a receiver looks for its sender by default.
pub const FIND_WAIT: Duration = Duration::from_secs(10);
/// TXT keys.
const KEY_VERSION: &str = "v";
const KEY_NAMEPLATE: &str = "nameplate";
const KEY_PSK: &str = "psk";
/// The longest PSK accepted from an advert (ours are 64 hex digits).
const MAX_PSK_LEN: usize = 128;
/// Random bytes in a LAN mailbox's PSK (shown as hex).
const PSK_BYTES: usize = 32;
/// How long stopping waits for the daemon (the goodbye packets, the thread's exit) and for
/// the mailbox server to close.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// Why `--lan` could not advertise or find a sender.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LanError {
    /// The mDNS daemon failed (no usable interface, multicast not permitted).
    #[error("mDNS failed: {0}")]
    Mdns(String),
    /// The in-process mailbox could not start.
    #[error("cannot start the local mailbox: {0}")]
    Mailbox(String),
    /// No sender with the nameplate answered in time.
    #[error(
        "no sender with code number {nameplate} answered on the local network within {secs} s{refused}: check that both machines are on the same network, that the sender is still waiting, and that the firewalls allow mDNS (UDP port 5353, multicast 224.0.0.251); or use --server"
    )]
    NotFound {
        /// The code's nameplate.
        nameplate: Nameplate,
        /// The wait.
        secs: u64,
        /// Why an answer for it was refused, if one was (already formatted: `" (...)"`).
        refused: String,
    },
}

/// An advert that is not a usable Warren sender.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Malformed {
    /// A TXT key is missing.
    #[error("its TXT record has no `{0}`")]
    Missing(&'static str),
    /// Another protocol version.
    #[error("it speaks version {0} of the LAN protocol, this Warren speaks {PROTOCOL_VERSION}")]
    Version(String),
    /// The nameplate is not a code number.
    #[error("its nameplate {0:?} is not a code number")]
    Nameplate(String),
    /// The PSK is empty or too long.
    #[error("its mailbox PSK is empty or longer than {MAX_PSK_LEN} bytes")]
    Psk,
    /// Port 0.
    #[error("its port is 0")]
    Port,
    /// No IPv4 address that can be dialled.
    #[error("it has no usable IPv4 address")]
    NoAddress,
}

/// What a sender advertises: where its mailbox is and how to use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advert {
    /// The nameplate of its code.
    pub nameplate: Nameplate,
    /// The mailbox's TCP port.
    pub port: u16,
    /// The mailbox's PSK (masked in `Debug`).
    pub psk: Secret,
}

impl Advert {
    /// The TXT record's key/value pairs.
    pub fn txt(&self) -> [(&'static str, String); 3] {
        [
            (KEY_VERSION, PROTOCOL_VERSION.to_owned()),
            (KEY_NAMEPLATE, self.nameplate.to_string()),
            (KEY_PSK, self.psk.expose().to_owned()),
        ]
    }

    /// Reads an advert from its port and TXT values (`txt` looks a key up).
    ///
    /// # Errors
    ///
    /// [`Malformed`] naming what is wrong; nothing here panics on network input.
    pub fn parse<'a>(
        port: u16,
        txt: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<Advert, Malformed> {
        let version = txt(KEY_VERSION).ok_or(Malformed::Missing(KEY_VERSION))?;
        if version != PROTOCOL_VERSION {
            return Err(Malformed::Version(version.chars().take(16).collect()));
        }
        let nameplate = txt(KEY_NAMEPLATE).ok_or(Malformed::Missing(KEY_NAMEPLATE))?;
        let nameplate = parse_nameplate(nameplate)
            .ok_or_else(|| Malformed::Nameplate(nameplate.chars().take(16).collect()))?;
        let psk = txt(KEY_PSK).ok_or(Malformed::Missing(KEY_PSK))?;
        if psk.is_empty() || psk.len() > MAX_PSK_LEN {
            return Err(Malformed::Psk);
        }
        if port == 0 {
            return Err(Malformed::Port);
        }
        Ok(Advert {
            nameplate,
            port,
            psk: Secret::new(psk),
        })
    }
}

/// A sender found on the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its advert.
    pub advert: Advert,
    /// Its mailbox's addresses, in a stable order (at least one).
    pub addrs: Vec<SocketAddr>,
}

impl Found {
    /// Reads a resolved mDNS answer.
    ///
    /// # Errors
    ///
    /// [`Malformed`] naming what is wrong.
    pub fn from_resolved(service: &ResolvedService) -> Result<Found, Malformed> {
        let advert = Advert::parse(service.get_port(), |key| service.get_property_val_str(key))?;
        let ips: BTreeSet<Ipv4Addr> = service
            .get_addresses_v4()
            .into_iter()
            .filter(|ip| dialable(*ip))
            .collect();
        if ips.is_empty() {
            return Err(Malformed::NoAddress);
        }
        let addrs = ips
            .into_iter()
            .map(|ip| SocketAddr::new(IpAddr::V4(ip), advert.port))
            .collect();
        Ok(Found { advert, addrs })
    }

    /// The mailbox at `addr` (one of [`Found::addrs`]).
    pub fn mailbox(&self, addr: SocketAddr) -> MailboxServer {
        MailboxServer {
            server: HostPort::from(addr),
            psk: self.advert.psk.clone(),
            quic: None,
            deadline: Duration::from_secs(10),
        }
    }
}

/// The mDNS instance name of the sender whose code has `nameplate`.
pub fn instance_name(nameplate: Nameplate) -> String {
    format!("warren-{nameplate}")
}

/// A nameplate as written in a TXT record: decimal digits only.
fn parse_nameplate(text: &str) -> Option<Nameplate> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().and_then(Nameplate::new)
}

/// Whether a peer may dial `ip`: a unicast address of a host on the network (not
/// loopback, which names the receiver itself, nor link-local, which the checks skip).
fn dialable(ip: Ipv4Addr) -> bool {
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast())
}

/// An mDNS daemon on the IPv4 interfaces other than loopback, shut down when dropped.
struct Daemon {
    daemon: ServiceDaemon,
    /// Shut down already (by [`Daemon::stop`]).
    stopped: bool,
}

impl Daemon {
    fn start() -> Result<Daemon, LanError> {
        let daemon = ServiceDaemon::new().map_err(|e| LanError::Mdns(e.to_string()))?;
        let daemon = Daemon {
            daemon,
            stopped: false,
        };
        // The mailbox is IPv4 only; loopback would advertise 127.0.0.1 to other hosts.
        daemon
            .daemon
            .disable_interface(vec![IfKind::IPv6, IfKind::LoopbackV4])
            .map_err(|e| LanError::Mdns(e.to_string()))?;
        Ok(daemon)
    }

    /// Shuts the daemon's thread down, waiting at most [`STOP_WAIT`].
    async fn stop(mut self) {
        self.stopped = true;
        if let Ok(status) = self.daemon.shutdown() {
            let _ = tokio::time::timeout(STOP_WAIT, status.recv_async()).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !self.stopped {
            // Without this the thread would run until the process ends.
            let _ = self.daemon.shutdown();
        }
    }
}

/// A sender's mDNS advertisement; withdrawn by [`Advertising::stop`] (or, without the
/// goodbye, when dropped).
pub struct Advertising {
    daemon: Daemon,
    fullname: String,
}

impl std::fmt::Debug for Advertising {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Advertising")
            .field("fullname", &self.fullname)
            .finish_non_exhaustive()
    }
}

impl Advertising {
    /// Advertises `advert` on the network.
    ///
    /// # Errors
    ///
    /// [`LanError::Mdns`] when the daemon cannot start or refuses the record.
    pub fn start(advert: &Advert) -> Result<Advertising, LanError> {
        let daemon = Daemon::start()?;
        let instance = instance_name(advert.nameplate);
        let host = format!("{instance}.local.");
        let txt = advert.txt();
        // No addresses given: the daemon publishes those of its interfaces (IPv4, not
        // loopback) and follows their changes.
        let info = ServiceInfo::new(SERVICE_TYPE, &instance, &host, (), advert.port, &txt[..])
            .map_err(|e| LanError::Mdns(e.to_string()))?
            .enable_addr_auto();
        let fullname = info.get_fullname().to_owned();
        daemon
            .daemon
            .register(info)
            .map_err(|e| LanError::Mdns(e.to_string()))?;
        tracing::debug!(event = "p2p_lan_advertised", instance = %instance, port = advert.port, "advertising the code's nameplate with mDNS");
        Ok(Advertising { daemon, fullname })
    }

    /// Withdraws the advertisement (goodbye packets) and stops the daemon; bounded.
    pub async fn stop(self) {
        if let Ok(done) = self.daemon.daemon.unregister(&self.fullname) {
            let _ = tokio::time::timeout(STOP_WAIT, done.recv_async()).await;
        }
        self.daemon.stop().await;
    }
}

/// Looks for the sender whose code has `nameplate`, for at most `wait`.
///
/// Answers for other nameplates are skipped; one for ours that is malformed (another
/// version, no PSK, port 0, no address) is refused and the search goes on.
///
/// # Errors
///
/// [`LanError::NotFound`] when no usable answer came in time (naming what to check),
/// [`LanError::Mdns`] when the daemon failed.
pub async fn find(nameplate: Nameplate, wait: Duration) -> Result<Found, LanError> {
    let daemon = Daemon::start()?;
    let result = browse(&daemon, nameplate, wait).await;
    daemon.stop().await;
    result
}

async fn browse(daemon: &Daemon, nameplate: Nameplate, wait: Duration) -> Result<Found, LanError> {
    let events = daemon
        .daemon
        .browse(SERVICE_TYPE)
        .map_err(|e| LanError::Mdns(e.to_string()))?;
    let until = Instant::now() + wait;
    let mut refused = String::new();
    loop {
        let event = match tokio::time::timeout_at(until, events.recv_async()).await {
            Err(_) => {
                return Err(LanError::NotFound {
                    nameplate,
                    secs: wait.as_secs(),
                    refused,
                });
            }
            Ok(Err(_)) => return Err(LanError::Mdns("the mDNS daemon stopped".into())),
            Ok(Ok(event)) => event,
        };
        let ServiceEvent::ServiceResolved(service) = event else {
            continue;
        };
        // Only answers that claim our nameplate count, well formed or not.
        let claimed = service
            .get_property_val_str(KEY_NAMEPLATE)
            .and_then(parse_nameplate);
        if claimed != Some(nameplate) {
            continue;
        }
        match Found::from_resolved(&service) {
            Ok(found) => return Ok(found),
            Err(reason) => {
                tracing::debug!(event = "p2p_lan_refused", instance = %service.get_fullname(), %reason, "refused an mDNS answer for our nameplate");
                refused = format!(" (an answer was refused: {reason})");
            }
        }
    }
}

/// The sender's own mailbox on the LAN: the server's `[server.p2p]` part, in process.
pub struct LanMailbox {
    port: u16,
    psk: Secret,
    stop: CancellationToken,
    server: Option<JoinHandle<()>>,
    advertising: Option<Advertising>,
}

impl std::fmt::Debug for LanMailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LanMailbox")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl LanMailbox {
    /// Starts the mailbox and the reflector on ephemeral ports of `0.0.0.0`, with a fresh
    /// PSK.
    ///
    /// # Errors
    ///
    /// [`LanError::Mailbox`] when a port cannot be bound.
    pub async fn start() -> Result<LanMailbox, LanError> {
        let psk = Secret::new(hex(&rand::random::<[u8; PSK_BYTES]>()));
        let any = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
        let mut config = crate::ServerConfig::new(any, psk.clone());
        config.p2p = Some(P2pConfig {
            udp_bind: any,
            relay: false,
            ..P2pConfig::default()
        });
        let server = crate::Server::from_config(config)
            .map_err(|e| LanError::Mailbox(e.to_string()))?
            .bind()
            .await
            .map_err(|e| LanError::Mailbox(e.to_string()))?;
        let port = server.local_addr().port();
        let stop = server.shutdown_token();
        let server = tokio::spawn(server.run());
        Ok(LanMailbox {
            port,
            psk,
            stop,
            server: Some(server),
            advertising: None,
        })
    }

    /// The mailbox, as the sender on this machine reaches it (loopback).
    pub fn mailbox(&self) -> MailboxServer {
        MailboxServer {
            server: HostPort::from(SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))),
            psk: self.psk.clone(),
            quic: None,
            deadline: Duration::from_secs(10),
        }
    }

    /// Advertises `nameplate` (allocated at this mailbox) on the network with mDNS.
    ///
    /// # Errors
    ///
    /// [`LanError::Mdns`].
    pub fn advertise(&mut self, nameplate: Nameplate) -> Result<(), LanError> {
        let advert = Advert {
            nameplate,
            port: self.port,
            psk: self.psk.clone(),
        };
        self.advertising = Some(Advertising::start(&advert)?);
        Ok(())
    }

    /// Withdraws the advertisement, stops the mDNS daemon and the mailbox; bounded.
    pub async fn close(mut self) {
        if let Some(advertising) = self.advertising.take() {
            advertising.stop().await;
        }
        self.stop.cancel();
        if let Some(server) = self.server.take() {
            let _ = tokio::time::timeout(STOP_WAIT, server).await;
        }
    }
}

impl Drop for LanMailbox {
    fn drop(&mut self) {
        // The advertisement's daemon stops in its own drop.
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn advert() -> Advert {
        Advert {
            nameplate: Nameplate::new(4821).unwrap(),
            port: 40_123,
            psk: Secret::new("ab".repeat(32)),
        }
    }

    /// A resolved answer as the daemon hands it over, from a record built the way a sender
    /// builds its own.
    fn resolved(port: u16, txt: &[(&str, String)], ips: &str) -> ResolvedService {
        ServiceInfo::new(
            SERVICE_TYPE,
            "warren-4821",
            "warren-4821.local.",
            ips,
            port,
            txt,
        )
        .unwrap()
        .as_resolved_service()
    }

    #[test]
    fn the_instance_name_carries_the_nameplate_and_nothing_else() {
        let nameplate = Nameplate::new(4821).unwrap();
        assert_eq!(instance_name(nameplate), "warren-4821");
        assert_eq!(instance_name(Nameplate::new(7).unwrap()), "warren-7");
    }

    #[test]
    fn the_txt_record_round_trips_and_holds_no_words() {
        let advert = advert();
        let txt: HashMap<&str, String> = advert.txt().into_iter().collect();
        assert_eq!(txt.len(), 3);
        assert_eq!(txt["v"], PROTOCOL_VERSION);
        assert_eq!(txt["nameplate"], "4821");
        assert_eq!(txt["psk"], "ab".repeat(32));
        let parsed = Advert::parse(advert.port, |k| txt.get(k).map(String::as_str)).unwrap();
        assert_eq!(parsed, advert);
        // Every record fits one TXT string (255 bytes with its key).
        for (key, value) in advert.txt() {
            assert!(key.len() + 1 + value.len() <= 255);
        }
    }

    #[test]
    fn a_resolved_answer_gives_the_mailbox_on_each_lan_address() {
        let txt = advert().txt();
        let service = resolved(
            40_123,
            &txt,
            "198.51.100.9,127.0.0.1,169.254.3.4,198.51.100.2",
        );
        let found = Found::from_resolved(&service).unwrap();
        assert_eq!(found.advert, advert());
        assert_eq!(
            found.addrs,
            vec![
                "198.51.100.2:40123".parse::<SocketAddr>().unwrap(),
                "198.51.100.9:40123".parse().unwrap()
            ]
        );
        let mailbox = found.mailbox(found.addrs[0]);
        assert_eq!(mailbox.server, HostPort::from(found.addrs[0]));
        assert_eq!(mailbox.psk, advert().psk);
    }

    #[test]
    fn malformed_answers_are_refused_with_the_reason() {
        let good = advert().txt();
        let without = |key: &str| -> Vec<(&'static str, String)> {
            good.iter().filter(|(k, _)| *k != key).cloned().collect()
        };
        let with = |key: &str, value: &str| -> Vec<(&'static str, String)> {
            good.iter()
                .map(|(k, v)| {
                    if *k == key {
                        (*k, value.to_owned())
                    } else {
                        (*k, v.clone())
                    }
                })
                .collect()
        };
        let lan = "198.51.100.9";
        let cases: Vec<(ResolvedService, Malformed)> = vec![
            (
                resolved(40_123, &without("v"), lan),
                Malformed::Missing("v"),
            ),
            (
                resolved(40_123, &with("v", "2"), lan),
                Malformed::Version("2".into()),
            ),
            (
                resolved(40_123, &without("nameplate"), lan),
                Malformed::Missing("nameplate"),
            ),
            (
                resolved(40_123, &with("nameplate", ""), lan),
                Malformed::Nameplate(String::new()),
            ),
            (
                resolved(40_123, &with("nameplate", "-12"), lan),
                Malformed::Nameplate("-12".into()),
            ),
            (
                resolved(40_123, &with("nameplate", "1000000000"), lan),
                Malformed::Nameplate("1000000000".into()),
            ),
            (
                resolved(40_123, &with("nameplate", "99999999999"), lan),
                Malformed::Nameplate("99999999999".into()),
            ),
            (
                resolved(40_123, &without("psk"), lan),
                Malformed::Missing("psk"),
            ),
            (resolved(40_123, &with("psk", ""), lan), Malformed::Psk),
            (
                resolved(40_123, &with("psk", &"x".repeat(200)), lan),
                Malformed::Psk,
            ),
            (resolved(0, &good, lan), Malformed::Port),
            (
                resolved(40_123, &good, "127.0.0.1,169.254.1.1"),
                Malformed::NoAddress,
            ),
            (
                resolved(40_123, &good, "fe80::1,2001:db8::1"),
                Malformed::NoAddress,
            ),
        ];
        for (service, expected) in cases {
            assert_eq!(
                Found::from_resolved(&service),
                Err(expected.clone()),
                "{expected}"
            );
        }
    }

    #[test]
    fn nameplates_in_txt_are_plain_digits() {
        assert_eq!(parse_nameplate("4821"), Nameplate::new(4821));
        assert_eq!(parse_nameplate("+4821"), None);
        assert_eq!(parse_nameplate(" 4821"), None);
        assert_eq!(parse_nameplate("48a1"), None);
    }

    #[test]
    fn the_psk_is_fresh_random_hex() {
        let a = hex(&rand::random::<[u8; PSK_BYTES]>());
        let b = hex(&rand::random::<[u8; PSK_BYTES]>());
        assert_eq!(a.len(), 2 * PSK_BYTES);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert_eq!(hex(&[0x00, 0x0f, 0xa5]), "000fa5");
    }
}
