//! Network faults at the IP layer (hardening issue 7, suite 4): the server runs inside a
//! network namespace joined to this one by a veth pair; iptables rules inside the namespace
//! cut the path (DROP, then restore) or lose 3 % of packets at random.
//!
//! Needs root, `ip` and `iptables`. Without them each test prints `SKIPPED …` and passes,
//! unless `WARREN_NETNS_TESTS=1` (set by `scripts/test.sh`), which makes it fail instead.
//! Every namespace (and with it the veth pair and its rules) is deleted on drop.

mod e2e_support;
mod harden;
#[path = "support/netns_tools.rs"]
mod netns_tools;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use e2e_support::*;
use harden::time_until_echo;
use netns_tools::run;
use tokio::time::Instant;

const MIB: usize = 1024 * 1024;
const SERVER_PORT: u16 = 7000;
const WEB_PORT: u16 = 8080;
const PROBE_PORT: u16 = 8081;

/// Skips (returns `true`) when unavailable, unless `WARREN_NETNS_TESTS=1`.
fn skip(test: &str) -> bool {
    netns_tools::skip(test, &["ip", "iptables"])
}

/// A namespace holding `inner` (10.231.N.2), linked to this namespace's `outer`
/// (10.231.N.1) by a veth pair. Deleted (with the pair and its rules) on drop.
struct Netns {
    name: String,
    inner: Ipv4Addr,
}

impl Netns {
    fn new() -> Netns {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = (std::process::id() % 1000) * 10 + n;
        let subnet = (std::process::id() % 200 + n * 7) % 250 + 1;
        let name = format!("warren-t{tag}");
        let (host_if, ns_if) = (format!("wt{tag}h"), format!("wt{tag}n"));
        let outer = format!("10.231.{subnet}.1");
        let inner = Ipv4Addr::new(10, 231, subnet as u8, 2);
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run(&["ip", "netns", "add", &name]);
        let ns = Netns { name, inner };
        run(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ]);
        run(&["ip", "link", "set", &ns_if, "netns", &ns.name]);
        run(&["ip", "addr", "add", &format!("{outer}/24"), "dev", &host_if]);
        run(&["ip", "link", "set", &host_if, "up"]);
        ns.exec(&["ip", "addr", "add", &format!("{inner}/24"), "dev", &ns_if]);
        ns.exec(&["ip", "link", "set", &ns_if, "up"]);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    fn exec(&self, args: &[&str]) {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        run(&full);
    }

    fn iptables(&self, rule: &str) {
        let mut args = vec!["iptables"];
        args.extend(rule.split_whitespace());
        self.exec(&args);
    }

    /// Packets dropped so far by the namespace's `statistic` (random loss) rules.
    fn dropped_packets(&self) -> u64 {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &self.name, "iptables", "-L", "-v", "-n", "-x",
            ])
            .output()
            .expect("iptables -L");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|line| line.contains("statistic") && line.contains("DROP"))
            .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    /// `warren server CONFIG` inside the namespace.
    fn spawn_server(&self, dir: &TestDir, config: &std::path::Path) -> Proc {
        Proc::spawn(
            dir,
            "server",
            "ip",
            &[
                "netns",
                "exec",
                &self.name,
                WARREN,
                "server",
                config.to_str().expect("utf-8"),
            ],
            &[("WARREN_PSK", PSK)],
        )
    }

    fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.inner), port)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace removes its end of the veth pair, which removes both.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Server in the namespace, client here; `web` forwards to `target`.
struct NsTunnel {
    ns: Netns,
    server: Proc,
    client: Proc,
}

impl NsTunnel {
    async fn start(dir: &TestDir, target: SocketAddr) -> NsTunnel {
        let ns = Netns::new();
        let setup = Setup::default();
        let ports = Ports {
            server: SERVER_PORT,
            web: WEB_PORT,
            probe: PROBE_PORT,
        };
        let inner = ns.inner.to_string();
        let server_config = dir.write(
            "server.toml",
            &server_toml(&setup, ports).replace("127.0.0.1", &inner),
        );
        let probe = echo_target().await;
        let client_config = dir.write(
            "client.toml",
            &client_toml(&setup, ports, target, probe).replace(
                &format!("127.0.0.1:{SERVER_PORT}"),
                &format!("{inner}:{SERVER_PORT}"),
            ),
        );
        let server = ns.spawn_server(dir, &server_config);
        let client = start_client(dir, &client_config, PSK);
        let tunnel = NsTunnel { ns, server, client };
        tunnel.ready(Duration::from_secs(10)).await;
        tunnel
    }

    async fn ready(&self, within: Duration) -> Duration {
        time_until_echo(self.ns.addr(PROBE_PORT), within)
            .await
            .unwrap_or_else(|| {
                panic!(
                    "tunnel not working within {within:?}\n{}\n{}",
                    self.server.logs(),
                    self.client.logs()
                )
            })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_network_heals_by_itself_within_the_backoff_bounds() {
    if skip("a_cut_network_heals_by_itself_within_the_backoff_bounds") {
        return;
    }
    let dir = TestDir::new("netns-cut");
    let (target, mut served) = hashing_target(100_000).await;
    let tunnel = NsTunnel::start(&dir, target).await;
    hashed_transfers(tunnel.ns.addr(WEB_PORT), &mut served, 2, 100_000, 100_000).await;

    // Cut client <-> server (the visitor path to the service ports stays open).
    tunnel
        .ns
        .iptables(&format!("-I INPUT -p tcp --dport {SERVER_PORT} -j DROP"));
    tunnel
        .ns
        .iptables(&format!("-I OUTPUT -p tcp --sport {SERVER_PORT} -j DROP"));
    // Longer than the client's heartbeat_timeout (3 s): both sides give the session up.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        time_until_echo(tunnel.ns.addr(PROBE_PORT), Duration::from_millis(500))
            .await
            .is_none(),
        "the tunnel worked through a cut network"
    );
    tunnel
        .ns
        .iptables(&format!("-D INPUT -p tcp --dport {SERVER_PORT} -j DROP"));
    tunnel
        .ns
        .iptables(&format!("-D OUTPUT -p tcp --sport {SERVER_PORT} -j DROP"));
    let restored = Instant::now();
    tunnel.ready(Duration::from_secs(10)).await;
    let back = restored.elapsed();
    eprintln!("netns: tunnel back {back:?} after the network was restored");
    // reconnect_max_delay is 500 ms; add a handshake timeout's worth of slack for an
    // attempt that was mid-flight (SYN dropped) when the path came back.
    assert!(back < Duration::from_secs(7), "took {back:?} to heal");
    hashed_transfers(tunnel.ns.addr(WEB_PORT), &mut served, 2, 100_000, 100_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_percent_packet_loss_keeps_every_byte_exact() {
    if skip("three_percent_packet_loss_keeps_every_byte_exact") {
        return;
    }
    let dir = TestDir::new("netns-loss");
    let (target, mut served) = hashing_target(4 * MIB).await;
    let tunnel = NsTunnel::start(&dir, target).await;
    tunnel
        .ns
        .iptables("-A INPUT -m statistic --mode random --probability 0.03 -j DROP");
    tunnel
        .ns
        .iptables("-A OUTPUT -m statistic --mode random --probability 0.03 -j DROP");
    let start = Instant::now();
    let (up, down) =
        hashed_transfers(tunnel.ns.addr(WEB_PORT), &mut served, 2, 4 * MIB, 4 * MIB).await;
    let dropped = tunnel.ns.dropped_packets();
    eprintln!(
        "netns: 3% loss each way ({dropped} packets dropped): {up} bytes up, {down} down, exact, in {:?}",
        start.elapsed()
    );
    assert!(
        dropped > 10,
        "the loss rules dropped only {dropped} packets: not a lossy path"
    );
}

// ---------------------------------------------------------------------------------------
// `transports = [...]` (issue 19): the server in the namespace listens on QUIC and noise on
// port 7000 and on wss on 443; the client here lists them in that order. Rules inside the
// namespace make the network drop what a firewall would; one rule here makes this host's
// `sendmsg` refuse UDP (EPERM).

const WSS_PORT: u16 = 443;
const ALL_TRANSPORTS: &str = r#"["quic", "noise", "wss:443"]"#;

/// Server in `ns` with every transport, client here with `client_web` in its `web`
/// service; `rules` are applied in the namespace before the client starts. Returns when the
/// client was spawned, for timing.
async fn start_fallback(
    ns: Netns,
    dir: &TestDir,
    target: SocketAddr,
    client_web: &str,
    rules: &[&str],
) -> (NsTunnel, Instant) {
    let setup = Setup {
        client_web: client_web.to_owned(),
        ..Setup::default()
    };
    let ports = Ports {
        server: SERVER_PORT,
        web: WEB_PORT,
        probe: PROBE_PORT,
    };
    let inner = ns.inner.to_string();
    let server_text = server_toml(&setup, ports)
        .replace("127.0.0.1", &inner)
        .replace(
            "transport = \"noise\"",
            &format!("transports = {ALL_TRANSPORTS}"),
        )
        .replace(
            "\n[server.services.web]",
            &format!(
                "\n[server.quic]\ncert = \"{quic}\"\n[server.tls]\ncert = \"{tls}\"\n\n[server.services.web]",
                quic = dir.path().join("quic.pem").display(),
                tls = dir.path().join("tls.pem").display(),
            ),
        );
    let server_config = dir.write("server.toml", &server_text);
    let probe = echo_target().await;
    let client_text = client_toml(&setup, ports, target, probe)
        .replace(
            &format!("127.0.0.1:{SERVER_PORT}"),
            &format!("{inner}:{SERVER_PORT}"),
        )
        .replace(
            "transport = \"noise\"",
            &format!("transports = {ALL_TRANSPORTS}\ntransport_retry = \"1s\""),
        );
    let client_config = dir.write("client.toml", &client_text);
    let server = ns.spawn_server(dir, &server_config);
    // Both ports listening before the rules and the client.
    for port in [SERVER_PORT, WSS_PORT] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(ns.addr(port)).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "server not listening on {port}\n{}",
                server.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for rule in rules {
        ns.iptables(rule);
    }
    let started = Instant::now();
    let client = Proc::warren(
        dir,
        "client",
        &[
            "--log-format",
            "json",
            "client",
            client_config.to_str().expect("utf-8"),
        ],
        &[("WARREN_PSK", PSK)],
    );
    (NsTunnel { ns, server, client }, started)
}

/// Waits (up to `within`) for the tunnel to work; returns how long that took from
/// `started` and the client's `transport_chosen` event.
async fn chosen_after(
    tunnel: &mut NsTunnel,
    started: Instant,
    within: Duration,
) -> (Duration, serde_json::Value) {
    tunnel.ready(within).await;
    let took = started.elapsed();
    let chosen = client_event(tunnel, "transport_chosen", Duration::from_secs(1)).await;
    (took, chosen)
}

/// The fields of the client's last `event` log line, waiting up to `within` for it.
async fn client_event(tunnel: &mut NsTunnel, event: &str, within: Duration) -> serde_json::Value {
    let needle = format!("\"event\":\"{event}\"");
    assert!(
        tunnel.client.stderr_contains_within(&needle, within).await,
        "the client logged no {event} within {within:?}\n{}",
        tunnel.client.logs()
    );
    json_events(&tunnel.client.stderr())
        .into_iter()
        .rev()
        .find(|line| line["fields"]["event"] == event)
        .map(|line| line["fields"].clone())
        .expect("the event parses as JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_blackholed_the_client_is_on_noise_within_2_5_s() {
    if skip("udp_blackholed_the_client_is_on_noise_within_2_5_s") {
        return;
    }
    let dir = TestDir::new("netns-no-udp");
    let (target, mut served) = hashing_target(100_000).await;
    let drop_udp = format!("-A INPUT -p udp --dport {SERVER_PORT} -j DROP");
    let (mut tunnel, started) = start_fallback(Netns::new(), &dir, target, "", &[&drop_udp]).await;
    let (took, chosen) = chosen_after(&mut tunnel, started, Duration::from_secs(5)).await;
    eprintln!(
        "netns: UDP blackholed -> on {} in {took:?} ({chosen})",
        chosen["transport"]
    );
    assert_eq!(chosen["transport"], "noise", "{chosen}");
    assert!(took <= Duration::from_millis(2500), "took {took:?}");
    hashed_transfers(tunnel.ns.addr(WEB_PORT), &mut served, 2, 1_000_000, 100_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_tcp_443_open_the_client_is_on_wss_within_4_s() {
    if skip("only_tcp_443_open_the_client_is_on_wss_within_4_s") {
        return;
    }
    let dir = TestDir::new("netns-443");
    let (target, mut served) = hashing_target(100_000).await;
    let drop_udp = format!("-A INPUT -p udp --dport {SERVER_PORT} -j DROP");
    let drop_tcp = format!("-A INPUT -p tcp --dport {SERVER_PORT} -j DROP");
    let (mut tunnel, started) =
        start_fallback(Netns::new(), &dir, target, "", &[&drop_udp, &drop_tcp]).await;
    let (took, chosen) = chosen_after(&mut tunnel, started, Duration::from_secs(8)).await;
    eprintln!(
        "netns: only TCP 443 -> on {} in {took:?} ({chosen})",
        chosen["transport"]
    );
    assert_eq!(chosen["transport"], "wss:443", "{chosen}");
    assert!(took <= Duration::from_secs(4), "took {took:?}");
    hashed_transfers(tunnel.ns.addr(WEB_PORT), &mut served, 2, 1_000_000, 100_000).await;
}

/// An iptables rule in this (the root) namespace, deleted on drop.
struct HostRule(String);

impl HostRule {
    fn insert(rule: String) -> HostRule {
        let mut args = vec!["iptables", "-I"];
        args.extend(rule.split_whitespace());
        run(&args);
        HostRule(rule)
    }
}

impl Drop for HostRule {
    fn drop(&mut self) {
        let mut args = vec!["-D"];
        args.extend(self.0.split_whitespace());
        let _ = Command::new("iptables").args(&args).output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eperm_on_udp_falls_back_in_under_300_ms() {
    if skip("eperm_on_udp_falls_back_in_under_300_ms") {
        return;
    }
    let dir = TestDir::new("netns-eperm");
    let (target, mut served) = hashing_target(100_000).await;
    let ns = Netns::new();
    // This host's own firewall refuses UDP to the server: `sendmsg` says EPERM.
    let _rule = HostRule::insert(format!("OUTPUT -p udp -d {} -j DROP", ns.inner));
    let (mut tunnel, started) = start_fallback(ns, &dir, target, "", &[]).await;
    let (took, chosen) = chosen_after(&mut tunnel, started, Duration::from_secs(5)).await;
    let elapsed = chosen["elapsed_ms"].as_u64().expect("elapsed_ms");
    eprintln!(
        "netns: EPERM on UDP -> on {} after {elapsed} ms of racing ({took:?} from spawn; {chosen})",
        chosen["transport"]
    );
    assert_eq!(chosen["transport"], "noise", "{chosen}");
    assert!(
        chosen["failed"].as_str().unwrap_or("").contains("firewall"),
        "the QUIC attempt's failure names the firewall: {chosen}"
    );
    assert!(elapsed < 300, "fallback took {elapsed} ms");
    hashed_transfers(tunnel.ns.addr(WEB_PORT), &mut served, 2, 1_000_000, 100_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_coming_back_moves_the_client_to_quic_while_a_transfer_flows() {
    if skip("udp_coming_back_moves_the_client_to_quic_while_a_transfer_flows") {
        return;
    }
    let dir = TestDir::new("netns-udp-back");
    let (target, mut served) = hashing_target(100_000).await;
    let drop_udp = format!("INPUT -p udp --dport {SERVER_PORT} -j DROP");
    // 12 MB up at 4 MB/s: about 3 s of transfer.
    let (mut tunnel, started) = start_fallback(
        Netns::new(),
        &dir,
        target,
        "bandwidth_limit = \"4MB/s\"\n",
        &[&format!("-A {drop_udp}")],
    )
    .await;
    let (_, chosen) = chosen_after(&mut tunnel, started, Duration::from_secs(5)).await;
    assert_eq!(chosen["transport"], "noise", "{chosen}");

    let web = tunnel.ns.addr(WEB_PORT);
    let transfer =
        tokio::spawn(
            async move { hashed_transfers(web, &mut served, 1, 12_000_000, 100_000).await },
        );
    tokio::time::sleep(Duration::from_millis(500)).await;
    tunnel.ns.iptables(&format!("-D {drop_udp}"));
    let upgraded = client_event(&mut tunnel, "transport_upgraded", Duration::from_secs(5)).await;
    eprintln!("netns: UDP back -> {upgraded}");
    assert_eq!(upgraded["to"], "quic", "{upgraded}");
    assert!(
        !transfer.is_finished(),
        "the move must happen while the transfer flows"
    );
    let (up, down) = transfer.await.expect("the transfer's bytes are exact");
    eprintln!("netns: {up} bytes up, {down} down, exact across the move");
    // New visitors ride the QUIC session.
    tunnel.ready(Duration::from_secs(2)).await;
}
