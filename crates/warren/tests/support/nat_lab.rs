//! The NAT lab (`../shared/P2P.md`'s recipe, measured on these machines), shared by
//! `tests/p2p_punch.rs` (the punch-only matrix) and `tests/e2e_files_nat.rs` (the real
//! `warren send` / `warren receive` through the same NATs): a "public" namespace with a
//! bridge on two addresses (203.0.113.1 and .2), two NAT routers (203.0.113.11 and .12)
//! and a peer behind each (198.51.100.2/25 and 198.51.100.130/25), or both peers behind
//! the first router ([`Layout::Shared`]). [`Lab::with_peers`] builds up to four peers,
//! each behind its own router (WAN 203.0.113.1I; the third and fourth LANs are
//! 192.0.2.0/25 and 192.0.2.128/25).
//!
//! Each cell builds a lab afresh and sets each router's NAT type. Processes started in it
//! (the including test binary as a child, [`Lab::spawn`], or any program,
//! [`Lab::spawn_cmd`]) write their stdout and stderr to files in the lab's directory and
//! are killed on drop; every namespace (with its veths and rules) is deleted on drop, pass
//! or fail. Only documentation ranges, and only inside the lab's own namespaces.
//!
//! Needs root, `ip`, `nft` and `iptables`; without them [`skip`] prints `SKIPPED …` and
//! the test passes, unless `WARREN_NETNS_TESTS=1`.
//!
//! A test binary including this module declares the child entry point its children run:
//!
//! ```ignore
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! async fn nat_lab_child() {
//!     nat_lab::child().await; // `reflector` and `classify`; returns for other sides
//! }
//! ```
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::netns_tools::run;

use serde_json::Value;
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use warren::p2p::net::reflector::{self, DiscoverConfig, ReflectorConfig};

/// Where the peers sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Each behind its own router.
    Separate,
    /// Both behind one router (two LAN ports): host candidates must win.
    Shared,
}

/// A router's NAT behaviour (P2P.md's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nat {
    /// Routing only: the peer's address is public.
    None,
    /// Endpoint-independent mapping and filtering.
    Full,
    /// Endpoint-independent mapping, address-restricted filtering.
    Restr,
    /// Endpoint-independent mapping, port-restricted filtering.
    Port,
    /// Endpoint-dependent mapping (random ports), established-only filtering.
    Symm,
}

impl Nat {
    /// All five, from the most open to the harshest.
    pub const ALL: [Nat; 5] = [Nat::None, Nat::Full, Nat::Restr, Nat::Port, Nat::Symm];

    pub fn name(self) -> &'static str {
        match self {
            Nat::None => "none",
            Nat::Full => "full",
            Nat::Restr => "restr",
            Nat::Port => "port",
            Nat::Symm => "symm",
        }
    }

    /// What [`child`]'s `classify` side must print for a peer behind this NAT: the
    /// mapping is endpoint-dependent only for `symm`.
    pub fn mapping(self) -> &'static str {
        if self == Nat::Symm { "edm" } else { "eim" }
    }
}

/// A cell's name in the tables: `port × symm`, or `both behind one symm`.
pub fn cell_name(left: Nat, right: Nat, layout: Layout) -> String {
    match layout {
        Layout::Separate => format!("{} × {}", left.name(), right.name()),
        Layout::Shared => format!("both behind one {}", left.name()),
    }
}

/// Whether `test` must be skipped (printed with the reason); a failure instead when
/// `WARREN_NETNS_TESTS=1`. Every file that includes this one includes
/// `support/netns_tools.rs` as `netns_tools` too.
pub fn skip(test: &str) -> bool {
    crate::netns_tools::skip(test, &["ip", "nft", "iptables"])
}

/// Runs per cell: `WARREN_LAB_RUNS`, else `default`.
pub fn runs(default: usize) -> usize {
    std::env::var("WARREN_LAB_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(default)
}

fn run_stdin(args: &[&str], input: &str) {
    use std::io::Write;
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{args:?} failed: {}\n{input}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One process in the lab, its output in files.
struct LabChild {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    status: Option<ExitStatus>,
}

impl LabChild {
    fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    fn kill(&mut self) {
        if self.try_status().is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
    }
}

/// One lab: the public namespace, a router per NAT and a namespace per peer, deleted on
/// drop (with their veths and rules); children started in it are killed on drop too.
pub struct Lab {
    prefix: String,
    /// How many `natN` and `peerN` namespaces it made (named from 1): the cleanup's list.
    routers: usize,
    peers: usize,
    children: Vec<LabChild>,
    pub dir: PathBuf,
}

pub const REFLECTOR: &str = "203.0.113.1:3478";
pub const REFLECTOR2: &str = "203.0.113.2:3478";

/// The most peers a lab holds: one LAN block each in [`LANS`].
pub const MAX_PEERS: usize = 4;

/// Peer `i`'s LAN (from 1), documentation ranges only: (router's address, peer's
/// address, network), each a /25.
const LANS: [(&str, &str, &str); MAX_PEERS] = [
    ("198.51.100.1", "198.51.100.2", "198.51.100.0/25"),
    ("198.51.100.129", "198.51.100.130", "198.51.100.128/25"),
    ("192.0.2.1", "192.0.2.2", "192.0.2.0/25"),
    ("192.0.2.129", "192.0.2.130", "192.0.2.128/25"),
];

/// Router `natI`'s public (WAN) address: 203.0.113.1I.
pub fn wan(i: usize) -> String {
    format!("203.0.113.1{i}")
}

impl Lab {
    /// Two peers, each behind its own router (`Shared`: both behind the first router,
    /// on two LAN ports, `right` ignored).
    pub fn new(left: Nat, right: Nat, layout: Layout) -> Lab {
        match layout {
            Layout::Separate => Lab::with_peers(&[left, right]),
            Layout::Shared => Lab::build(&[left, left], Layout::Shared),
        }
    }

    /// One peer per entry of `nats` (`peer1`, `peer2`, …), each behind its own router
    /// (`nat1`, `nat2`, …, WAN 203.0.113.11, .12, …) of that NAT kind; at most
    /// [`MAX_PEERS`].
    pub fn with_peers(nats: &[Nat]) -> Lab {
        Lab::build(nats, Layout::Separate)
    }

    /// `Separate`: peer `i` behind router `i` of kind `nats[i - 1]`. `Shared`: every
    /// peer behind router 1 (of kind `nats[0]`), peer `i` on its LAN port `eth{i}`.
    fn build(nats: &[Nat], layout: Layout) -> Lab {
        assert!(
            (1..=MAX_PEERS).contains(&nats.len()),
            "a lab holds 1 to {MAX_PEERS} peers, not {}",
            nats.len()
        );
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("wp{}x{n}", std::process::id() % 100_000);
        let dir = std::env::temp_dir().join(format!("warren-lab-{prefix}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Made before the first namespace: a failing step below still deletes them all.
        let lab = Lab {
            prefix,
            routers: if layout == Layout::Shared {
                1
            } else {
                nats.len()
            },
            peers: nats.len(),
            children: Vec::new(),
            dir,
        };
        for ns in lab.all() {
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
            run(&["ip", "netns", "add", &ns]);
            lab.exec(&ns, &["ip", "link", "set", "lo", "up"]);
        }
        let public = lab.ns("pub");
        lab.exec(&public, &["ip", "link", "add", "br0", "type", "bridge"]);
        lab.exec(
            &public,
            &["ip", "addr", "add", "203.0.113.1/24", "dev", "br0"],
        );
        lab.exec(
            &public,
            &["ip", "addr", "add", "203.0.113.2/24", "dev", "br0"],
        );
        lab.exec(&public, &["ip", "link", "set", "br0", "up"]);
        let mut public_lans = Vec::new();
        for (i, &nat) in (1..).zip(nats) {
            // Behind one router, the later peers on its further LAN ports.
            let shared_port = layout == Layout::Shared && i > 1;
            let r = if layout == Layout::Shared { 1 } else { i };
            let router = lab.ns(&format!("nat{r}"));
            let lan_if = format!("eth{}", if layout == Layout::Shared { i } else { 1 });
            let lan_if = lan_if.as_str();
            let peer = lab.ns(&format!("peer{i}"));
            let wan = wan(i);
            let (lan_gw, lan_peer, lan_net) = LANS[i - 1];
            // WAN: a veth from the bridge to the router's eth0.
            let up = format!("up{i}");
            if !shared_port {
                lab.exec(
                    &public,
                    &[
                        "ip", "link", "add", &up, "type", "veth", "peer", "name", "eth0", "netns",
                        &router,
                    ],
                );
                lab.exec(&public, &["ip", "link", "set", &up, "master", "br0", "up"]);
                lab.exec(
                    &router,
                    &["ip", "addr", "add", &format!("{wan}/24"), "dev", "eth0"],
                );
                lab.exec(&router, &["ip", "link", "set", "eth0", "up"]);
            }
            // LAN: router's eth1 (or ethI behind a shared router) to the peer's eth0.
            lab.exec(
                &router,
                &[
                    "ip", "link", "add", lan_if, "type", "veth", "peer", "name", "eth0", "netns",
                    &peer,
                ],
            );
            lab.exec(
                &router,
                &["ip", "addr", "add", &format!("{lan_gw}/25"), "dev", lan_if],
            );
            lab.exec(&router, &["ip", "link", "set", lan_if, "up"]);
            lab.exec(&router, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
            lab.exec(
                &peer,
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("{lan_peer}/25"),
                    "dev",
                    "eth0",
                ],
            );
            lab.exec(&peer, &["ip", "link", "set", "eth0", "up"]);
            lab.exec(&peer, &["ip", "route", "add", "default", "via", lan_gw]);
            if shared_port {
                continue;
            }
            lab.set_nat(&router, nat, &wan);
            if nat == Nat::None {
                public_lans.push((i, lan_net, wan));
            }
        }
        // A public LAN: the public namespace and every other router route to it through
        // its router.
        for (i, lan_net, wan) in public_lans {
            lab.exec(&public, &["ip", "route", "add", lan_net, "via", &wan]);
            for other in (1..=lab.routers).filter(|&r| r != i) {
                lab.exec(
                    &lab.ns(&format!("nat{other}")),
                    &["ip", "route", "add", lan_net, "via", &wan],
                );
            }
        }
        lab
    }

    /// Every namespace this lab made: `pub`, `nat1..`, `peer1..`.
    fn all(&self) -> Vec<String> {
        let routers = (1..=self.routers).map(|i| format!("nat{i}"));
        let peers = (1..=self.peers).map(|i| format!("peer{i}"));
        std::iter::once("pub".to_owned())
            .chain(routers)
            .chain(peers)
            .map(|n| self.ns(&n))
            .collect()
    }

    pub fn ns(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn exec(&self, ns: &str, args: &[&str]) {
        let mut full = vec!["ip", "netns", "exec", ns];
        full.extend_from_slice(args);
        run(&full);
    }

    fn set_nat(&self, router: &str, nat: Nat, wan: &str) {
        let filter = match nat {
            Nat::None => return,
            Nat::Symm => {
                for rule in [
                    "-t nat -A POSTROUTING -o eth0 -j MASQUERADE --random-fully",
                    "-A FORWARD -i eth0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
                    "-A FORWARD -i eth0 -j DROP",
                ] {
                    let mut args = vec!["iptables"];
                    args.extend(rule.split_whitespace());
                    self.exec(router, &args);
                }
                return;
            }
            Nat::Full => "",
            Nat::Restr => {
                "oif \"eth0\" update @contacted { ip daddr }\n    \
                 iif \"eth0\" ct state established,related accept\n    \
                 iif \"eth0\" ip saddr @contacted accept\n    iif \"eth0\" drop"
            }
            Nat::Port => "iif \"eth0\" ct state established,related accept\n    iif \"eth0\" drop",
        };
        // P2P.md's endpoint-independent NAT: a dynamic map from the public port to the
        // private address and port, refreshed by every outgoing packet.
        let script = format!(
            "table ip lab {{
  map fullcone {{ type inet_service : ipv4_addr . inet_service; flags dynamic,timeout; timeout 300s; size 65536;
  }}
  set contacted {{ type ipv4_addr; flags dynamic,timeout; timeout 300s;
  }}
  chain prer {{ type nat hook prerouting priority dstnat; policy accept;
    iif \"eth0\" meta l4proto udp dnat ip to udp dport map @fullcone
  }}
  chain postr {{ type nat hook postrouting priority srcnat; policy accept;
    oif \"eth0\" meta l4proto udp update @fullcone {{ udp sport timeout 300s : ip saddr . udp sport }}
    oif \"eth0\" snat ip to {wan}
  }}
  chain filt {{ type filter hook forward priority 0; policy accept;
    {filter}
  }}
}}
"
        );
        run_stdin(&["ip", "netns", "exec", router, "nft", "-f", "-"], &script);
    }

    /// Router `nat` (from 1) forwards no UDP at all, either way (a network that allows
    /// only TCP): its own table, ahead of the NAT's filter.
    pub fn block_udp(&self, nat: u8) {
        let router = self.ns(&format!("nat{nat}"));
        run_stdin(
            &["ip", "netns", "exec", &router, "nft", "-f", "-"],
            "table ip blockudp {
  chain forward { type filter hook forward priority -10; policy accept;
    meta l4proto udp drop
  }
}
",
        );
    }

    /// Router `nat` (from 1) drops every packet from and to `addr` (the other router's
    /// public address: the direct path) until [`Lab::unblock_direct`]; the server's relay
    /// still gets through.
    pub fn block_direct(&self, nat: u8, addr: &str) {
        let router = self.ns(&format!("nat{nat}"));
        run_stdin(
            &["ip", "netns", "exec", &router, "nft", "-f", "-"],
            &format!(
                "table ip blockdirect {{
  chain forward {{ type filter hook forward priority -10; policy accept;
    ip saddr {addr} drop
    ip daddr {addr} drop
  }}
}}
"
            ),
        );
    }

    /// Lifts [`Lab::block_direct`] on router `nat`.
    pub fn unblock_direct(&self, nat: u8) {
        let router = self.ns(&format!("nat{nat}"));
        self.exec(&router, &["nft", "delete", "table", "ip", "blockdirect"]);
    }

    /// Starts this test binary's `nat_lab_child` in namespace `ns` with `env` (and
    /// `WARREN_LAB_DIR`); returns its index.
    pub fn spawn(&mut self, ns: &str, env: &[(&str, String)]) -> usize {
        let exe = std::env::current_exe().unwrap();
        let exe = exe.to_str().expect("a UTF-8 test binary path").to_owned();
        let dir = self.dir.to_str().expect("a UTF-8 temp dir").to_owned();
        let mut env = env.to_vec();
        env.push(("WARREN_LAB_DIR", dir));
        let side = env
            .iter()
            .find(|(k, _)| *k == "WARREN_LAB_SIDE")
            .map_or("child".into(), |(_, v)| v.clone());
        self.spawn_cmd(
            ns,
            &side,
            &exe,
            &[
                "--exact",
                "nat_lab_child",
                "--nocapture",
                "--test-threads=1",
            ],
            &env,
        )
    }

    /// Starts `program args..` in namespace `ns` with `env` added (and `NO_COLOR=1`),
    /// stdout and stderr to `NAME.N.stdout|stderr` in the lab's directory; returns its
    /// index. Killed on drop, if still running.
    pub fn spawn_cmd(
        &mut self,
        ns: &str,
        name: &str,
        program: &str,
        args: &[&str],
        env: &[(&str, String)],
    ) -> usize {
        let i = self.children.len();
        let stdout = self.dir.join(format!("{name}.{i}.stdout"));
        let stderr = self.dir.join(format!("{name}.{i}.stderr"));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, program])
            .args(args)
            .current_dir(&self.dir)
            .env_remove("WARREN_PSK")
            .env_remove("WARREN_SERVER")
            .env_remove("WARREN_CODE")
            .env_remove("WARREN_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("create a stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("create a stderr file"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        // `ip netns exec` execs the program: the child's pid is the program's.
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program} in {ns}: {e}"));
        self.children.push(LabChild {
            child,
            stdout,
            stderr,
            status: None,
        });
        i
    }

    /// Child `i`'s stdout so far, as bytes.
    pub fn stdout_bytes(&self, i: usize) -> Vec<u8> {
        std::fs::read(&self.children[i].stdout).unwrap_or_default()
    }

    /// Child `i`'s stdout so far.
    pub fn stdout(&self, i: usize) -> String {
        std::fs::read_to_string(&self.children[i].stdout).unwrap_or_default()
    }

    /// Child `i`'s stderr so far.
    pub fn stderr(&self, i: usize) -> String {
        std::fs::read_to_string(&self.children[i].stderr).unwrap_or_default()
    }

    /// Child `i`'s exit status, if it has exited.
    pub fn try_status(&mut self, i: usize) -> Option<ExitStatus> {
        self.children[i].try_status()
    }

    /// Waits at most `within` for child `i` to exit; `None` if it still runs.
    pub fn wait_exit(&mut self, i: usize, within: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + within;
        loop {
            if let Some(status) = self.try_status(i) {
                return Some(status);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls child `i`'s stdout for a line containing `needle`, at most `within` and only
    /// while the child runs; returns the line.
    pub fn wait_line(&mut self, i: usize, needle: &str, within: Duration) -> Option<String> {
        let until = Instant::now() + within;
        loop {
            let found = self
                .stdout(i)
                .lines()
                .find(|l| l.contains(needle))
                .map(str::to_owned);
            if found.is_some() {
                return found;
            }
            if Instant::now() >= until || self.try_status(i).is_some() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls child `i`'s stderr until it contains `needle`, at most `within`.
    pub fn wait_stderr(&mut self, i: usize, needle: &str, within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            if self.stderr(i).contains(needle) {
                return true;
            }
            if Instant::now() >= until || self.try_status(i).is_some() {
                return self.stderr(i).contains(needle);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL child `i` if it still runs.
    pub fn kill(&mut self, i: usize) {
        self.children[i].kill();
    }

    /// Waits (bounded; killed after `within`) for child `i` and returns its stdout and
    /// stderr.
    pub fn wait(&mut self, i: usize, within: Duration) -> (String, String) {
        if self.wait_exit(i, within).is_none() {
            self.kill(i);
        }
        (self.stdout(i), self.stderr(i))
    }

    /// Starts the two-address reflector `classify` needs, in the public namespace.
    pub fn start_reflectors(&mut self) -> usize {
        let i = self.spawn(&self.ns("pub"), &[("WARREN_LAB_SIDE", "reflector".into())]);
        // Bounded: it binds at once, or the classification below says so.
        std::thread::sleep(Duration::from_millis(200));
        i
    }

    /// The mapping behaviour (`eim` or `edm`) of the NAT in front of `peer` (`peer1`,
    /// `peer2`, …), RFC 5780 style against the two reflector addresses, from a fresh socket;
    /// an `Err` with the child's output when it could not tell.
    pub fn classify(&mut self, peer: &str) -> Result<&'static str, String> {
        let i = self.spawn(&self.ns(peer), &[("WARREN_LAB_SIDE", "classify".into())]);
        let (out, err) = self.wait(i, Duration::from_secs(10));
        if out.contains("MAPPING eim") {
            Ok("eim")
        } else if out.contains("MAPPING edm") {
            Ok("edm")
        } else {
            Err(format!("{peer}: no MAPPING line:\n{out}\n{err}"))
        }
    }

    pub fn clear_dir(&self) {
        for name in ["a.cand", "b.cand", "cert.der"] {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for child in &mut self.children {
            child.kill();
        }
        for ns in self.all() {
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes `bytes` to `dir/name` atomically (the other peer polls for it).
pub fn put(dir: &Path, name: &str, bytes: &[u8]) {
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(tmp, dir.join(name)).unwrap();
}

/// Waits (bounded) for `dir/name`.
pub async fn get(dir: &Path, name: &str, within: Duration) -> Vec<u8> {
    let until = tokio::time::Instant::now() + within;
    loop {
        if let Ok(bytes) = std::fs::read(dir.join(name)) {
            return bytes;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "no {name} from the other peer in {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The lab children this module defines, by `WARREN_LAB_SIDE`: `reflector` (both public
/// addresses, bounded in time in case the parent dies without killing it) and `classify`
/// (prints `MAPPING eim|edm SEEN1 SEEN2`). Returns the side for the caller's own children,
/// `None` when not in the lab or the side was handled here.
pub async fn child() -> Option<String> {
    let side = std::env::var("WARREN_LAB_SIDE").ok()?;
    match side.as_str() {
        "reflector" => {
            let one = UdpSocket::bind(REFLECTOR).await.unwrap();
            let two = UdpSocket::bind(REFLECTOR2).await.unwrap();
            let cancel = CancellationToken::new();
            let serve = async {
                tokio::join!(
                    reflector::serve(&one, ReflectorConfig::default(), cancel.clone()),
                    reflector::serve(&two, ReflectorConfig::default(), cancel.clone())
                )
            };
            let _ = tokio::time::timeout(Duration::from_secs(600), serve).await;
            None
        }
        "classify" => {
            let mut socket = UdpSocket::bind("0.0.0.0:0").await.unwrap();
            let config = DiscoverConfig::default();
            let seen1 = reflector::discover(&mut socket, REFLECTOR.parse().unwrap(), &config)
                .await
                .expect("reflexive address");
            let seen2 = reflector::discover(&mut socket, REFLECTOR2.parse().unwrap(), &config)
                .await
                .expect("reflexive address from the second reflector address");
            println!("{}", mapping_line(seen1, seen2));
            None
        }
        _ => Some(side),
    }
}

/// RFC 5780's mapping test: the same mapping towards two destinations is
/// endpoint-independent; a different one is a symmetric NAT.
pub fn mapping_line(seen1: std::net::SocketAddr, seen2: std::net::SocketAddr) -> String {
    format!(
        "MAPPING {} {seen1} {seen2}",
        if seen1 == seen2 { "eim" } else { "edm" }
    )
}

// Warren through the lab: the server in the public namespace and what the commands print.

/// The binary under test (the release binary under `cargo test --release`).
pub const WARREN: &str = env!("CARGO_BIN_EXE_warren");
pub const PSK: &str = "nat-matrix-psk-0123456789-abcdefgh";
/// The server's TCP port (mailbox) and, by default, its UDP port (reflector and relay).
pub const SERVER: &str = "203.0.113.1:7000";
/// Many runs from one router's address within a minute: the default rate limit (30
/// allocations and claims per client IP per minute) would refuse the later ones.
const SERVER_TOML: &str = r#"# the NAT lab's Warren server
[server]
bind = "203.0.113.1:7000"
psk = "${WARREN_PSK}"

[server.p2p]
rate_per_minute = 10000

[server.p2p.services.ssh]
token = "nat-lab-p2p-service-token-0123456789"
"#;

/// The token of the lab server's P2P service `ssh`.
pub const SERVICE_TOKEN: &str = "nat-lab-p2p-service-token-0123456789";
/// What one side printed with `--json`: its (last) `connected` event, or the `moved`
/// after it, and whether it finished.
#[derive(Debug, Default)]
pub struct Side {
    pub route: Option<String>,
    pub address: Option<String>,
    pub connect_ms: Option<u64>,
    pub finished: bool,
    /// A `moved` event came (the route is the one it moved to).
    pub moved: bool,
}

/// A listener's stdout holds every connection it served: a `moved` counts only for the
/// peer of the last `connected` (an earlier run's connection, its visitor killed, moves
/// to the relay when its direct path stops answering).
pub fn side_events(stdout: &str) -> Side {
    let mut side = Side::default();
    let mut peer = Value::Null;
    for line in stdout.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        match event["event"].as_str() {
            Some("moved") if event["peer"] != peer => {}
            Some("connected") => {
                peer = event["peer"].clone();
                side.route = event["route"].as_str().map(str::to_owned);
                side.address = event["address"].as_str().map(str::to_owned);
                side.connect_ms = Some(
                    event["agreed_ms"].as_u64().unwrap_or(0)
                        + event["connected_ms"].as_u64().unwrap_or(0),
                );
            }
            // A relayed tunnel that moved to the direct path: its route now.
            Some("moved") => {
                side.route = event["route"].as_str().map(str::to_owned);
                side.address = event["address"].as_str().map(str::to_owned);
                side.moved = true;
            }
            Some("finished") => side.finished = true,
            _ => {}
        }
    }
    side
}

/// Starts `warren server` in the public namespace and waits (bounded) until it listens.
pub fn start_server(lab: &mut Lab) -> usize {
    let config = lab.dir.join("server.toml");
    std::fs::write(&config, SERVER_TOML).unwrap();
    let config = config.to_str().unwrap().to_owned();
    let server = lab.spawn_cmd(
        &lab.ns("pub"),
        "server",
        WARREN,
        &["server", &config],
        &[("WARREN_PSK", PSK.into())],
    );
    assert!(
        lab.wait_stderr(server, "warren server listening", Duration::from_secs(10)),
        "warren server did not start:\n{}",
        lab.stderr(server)
    );
    server
}

/// The route P2P.md expects: direct unless both mappings are endpoint-dependent or one is
/// and the other side filters by port (no port prediction); restr × symm is direct through
/// peer-reflexive answers; behind one NAT, through host candidates.
pub fn expected(left: Nat, right: Nat, layout: Layout) -> &'static str {
    use Nat::{Port, Symm};
    match (layout, left, right) {
        (Layout::Shared, _, _) => "direct",
        (_, Symm, Symm) | (_, Port, Symm) | (_, Symm, Port) => "relayed",
        _ => "direct",
    }
}

/// The matrix's cells: every unordered pair of NAT kinds on separate routers, and two
/// peers behind one router of the kinds that matter there. `WARREN_LAB_CELLS` keeps only
/// the cells it names (`WARREN_LAB_CELLS="port × symm,both behind one port"`).
pub fn matrix_cells() -> Vec<(Nat, Nat, Layout)> {
    let mut cells = Vec::new();
    for (i, &left) in Nat::ALL.iter().enumerate() {
        for &right in &Nat::ALL[i..] {
            cells.push((left, right, Layout::Separate));
        }
    }
    // Behind one NAT without hairpinning: only the host candidates connect.
    cells.push((Nat::Symm, Nat::Symm, Layout::Shared));
    cells.push((Nat::Port, Nat::Port, Layout::Shared));
    if let Ok(only) = std::env::var("WARREN_LAB_CELLS") {
        cells
            .retain(|&(l, r, layout)| only.split(',').any(|c| c.trim() == cell_name(l, r, layout)));
    }
    cells
}

/// Prints a matrix's `table` (its runs per cell and how long it took since `started`) and
/// fails with every entry of `failures`, if any.
pub fn report(what: &str, runs: usize, started: Instant, table: &str, failures: &[String]) {
    println!(
        "NAT matrix through {what}, {runs} runs per cell, {:.1} s:\n{table}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} bad:\n\n{}\n\n{table}",
        failures.len(),
        failures.join("\n\n")
    );
}

impl Lab {
    /// Starts the reflectors and checks each router maps as the cell says (a rule typo
    /// must not pass as "relayed"); the problems found, named by `cell`.
    pub fn check_nats(&mut self, left: Nat, right: Nat, layout: Layout) -> Vec<String> {
        let right_nat = if layout == Layout::Shared {
            left
        } else {
            right
        };
        self.check_mappings(&cell_name(left, right, layout), &[left, right_nat])
    }

    /// Starts the reflectors and checks that the NAT in front of peer `i` maps as a
    /// `nats[i - 1]` NAT does, for every peer; the problems found, named by `cell`.
    pub fn check_mappings(&mut self, cell: &str, nats: &[Nat]) -> Vec<String> {
        self.start_reflectors();
        let mut problems = Vec::new();
        for (i, &nat) in (1..).zip(nats) {
            let peer = format!("peer{i}");
            match self.classify(&peer) {
                Ok(mapping) if mapping == nat.mapping() => {}
                Ok(mapping) => problems.push(format!(
                    "{cell}: {peer}'s NAT maps {mapping}, a {} NAT maps {}",
                    nat.name(),
                    nat.mapping()
                )),
                Err(error) => problems.push(format!("{cell}: {error}")),
            }
        }
        problems
    }
}
