//! `warren send --lan` / `warren receive --lan` through the real command line (issue 17:
//! "`--lan` finds the peer on the local network with mDNS and needs no server"): the release
//! binary in two network namespaces joined by a veth pair (198.51.100.1 and .2), no server
//! anywhere. One sender serves, in this order:
//!
//! * a receiver with the right code number and wrong words: it fails cleanly (exit 1, the
//!   wrong-code message) and the sender says so and keeps waiting;
//! * a receiver with a code number nobody announces: it gives up after its mDNS wait with
//!   a message naming what to check (run at the same time as the first);
//! * the right code: the tree arrives byte-exact (BLAKE3 of every file), both sides say
//!   `direct`, both exit 0;
//!
//! while a sniffer in the receiver's namespace records every mDNS packet on the link and
//! the test checks that none of them holds a word of the code. `WARREN_SERVER` is set to a
//! server that does not exist, so `--lan` must not look at it.
//!
//! Multicast never leaves the two namespaces (the veth pair has no end in this one). Needs
//! root and `ip`; without them the test prints `SKIPPED …` and passes, unless
//! `WARREN_NETNS_TESTS=1` (`scripts/test.sh` sets it). The namespaces, with the pair, are
//! deleted on drop, also when the test fails.

#[path = "support/netns_tools.rs"]
mod netns_tools;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use netns_tools::{hash_tree, run};
use rand::RngCore;
use serde_json::Value;
use tokio::time::Instant;

const WARREN: &str = env!("CARGO_BIN_EXE_warren");
const SENDER_IP: &str = "198.51.100.1";
const RECEIVER_IP: &str = "198.51.100.2";
/// The sniffer child: where it writes what it heard (set only by the parent).
const SNIFF_ENV: &str = "WARREN_LAN_SNIFF_OUT";
/// How long the sniffer listens at most (the parent stops it sooner).
const SNIFF_FOR: Duration = Duration::from_secs(60);
/// Every child exits within this, or the test fails.
const EXIT_WITHIN: Duration = Duration::from_secs(25);

/// Two namespaces, the sender's and the receiver's, joined by a veth pair and nothing
/// else. Deleted (with the pair) on drop.
struct Lan {
    sender: String,
    receiver: String,
}

impl Lan {
    fn new() -> Lan {
        let tag = std::process::id() % 100_000;
        let lan = Lan {
            sender: format!("wlan{tag}s"),
            receiver: format!("wlan{tag}r"),
        };
        for ns in [&lan.sender, &lan.receiver] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            run(&["ip", "netns", "add", ns]);
        }
        // Made inside the sender's namespace, the peer end moved straight to the
        // receiver's: no end ever sits in this namespace.
        run(&[
            "ip",
            "-n",
            &lan.sender,
            "link",
            "add",
            "lan0",
            "type",
            "veth",
            "peer",
            "name",
            "lan0",
            "netns",
            &lan.receiver,
        ]);
        for (ns, ip) in [(&lan.sender, SENDER_IP), (&lan.receiver, RECEIVER_IP)] {
            run(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                "lan0",
            ]);
            run(&["ip", "-n", ns, "link", "set", "lan0", "up"]);
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        lan
    }

    /// `args` run inside `ns`, stdout piped, stderr to a file in `logs`.
    fn spawn(&self, ns: &str, args: &[&str], logs: &Path, name: &str) -> Proc {
        let stderr = std::fs::File::create(logs.join(format!("{name}.stderr"))).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            // A server that does not exist: `--lan` must ignore it.
            .env("WARREN_SERVER", "192.0.2.1:7000")
            .env_remove("WARREN_PSK")
            .env_remove("WARREN_CODE")
            .env("WARREN_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {args:?} in {ns}: {e}"));
        Proc::new(child, logs.join(format!("{name}.stderr")), name)
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for ns in [&self.sender, &self.receiver] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// A child with its JSON events read as they come; killed on drop.
struct Proc {
    name: String,
    child: Child,
    events: mpsc::Receiver<Value>,
    seen: Vec<Value>,
    stderr: PathBuf,
}

impl Proc {
    fn new(mut child: Child, stderr: PathBuf, name: &str) -> Proc {
        let stdout = child.stdout.take().unwrap();
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value = serde_json::from_str(&line)
                    .unwrap_or_else(|_| serde_json::json!({"event": "not_json", "line": line}));
                if tx.send(value).is_err() {
                    break;
                }
            }
        });
        Proc {
            name: name.to_owned(),
            child,
            events,
            seen: Vec::new(),
            stderr,
        }
    }

    /// Waits (at most `within`) for the first event named `name`.
    fn wait_event(&mut self, name: &str, within: Duration) -> Value {
        let until = Instant::now() + within;
        if let Some(found) = self.seen.iter().find(|e| e["event"] == name) {
            return found.clone();
        }
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(event) => {
                    self.seen.push(event.clone());
                    if event["event"] == name {
                        return event;
                    }
                }
                Err(_) => panic!(
                    "{}: no `{name}` event within {within:?}; events {:?}; stderr:\n{}",
                    self.name,
                    self.seen,
                    self.stderr_text()
                ),
            }
        }
    }

    /// Waits (at most `within`) for the exit; returns the code and every event.
    fn wait_exit(&mut self, within: Duration) -> (i32, Vec<Value>) {
        let until = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The reader thread ends with the pipe; take what it read.
                while let Ok(event) = self.events.recv_timeout(Duration::from_millis(500)) {
                    self.seen.push(event);
                }
                return (status.code().unwrap_or(-1), self.seen.clone());
            }
            assert!(
                Instant::now() < until,
                "{} still running after {within:?}; events {:?}; stderr:\n{}",
                self.name,
                self.seen,
                self.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The tree sent: nested folders, an empty file, a 2 MiB one.
fn make_tree(root: &Path) -> BTreeMap<String, blake3::Hash> {
    let files: [(&str, usize); 5] = [
        ("big.bin", (2 << 20) + 321),
        ("empty", 0),
        ("notes.txt", 1000),
        ("sub/deeper/c.bin", 65_537),
        ("sub/one", 1),
    ];
    for (name, len) in files {
        let path = root.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut bytes = vec![0u8; len];
        rand::rng().fill_bytes(&mut bytes);
        std::fs::write(path, bytes).unwrap();
    }
    let hashes = hash_tree(root);
    assert_eq!(hashes.len(), files.len());
    hashes
}

/// The sniffer, run by the parent as a child of this binary inside the receiver's
/// namespace: records every mDNS datagram on the link into the file named by
/// [`SNIFF_ENV`] until a file of that name plus `.stop` appears (or [`SNIFF_FOR`]), then
/// writes `.done`. Does nothing in an ordinary run.
#[test]
fn lan_sniffer_child() {
    let Ok(out) = std::env::var(SNIFF_ENV) else {
        return;
    };
    let socket = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )
    .unwrap();
    // Shares 5353 with the receiver's mDNS daemon; multicast reaches every member.
    socket.set_reuse_address(true).unwrap();
    socket.set_reuse_port(true).unwrap();
    socket
        .bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 5353)).into())
        .unwrap();
    let socket: UdpSocket = socket.into();
    socket
        .join_multicast_v4(
            &Ipv4Addr::new(224, 0, 0, 251),
            &RECEIVER_IP.parse().unwrap(),
        )
        .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // Ready: the parent starts the peers once this file exists.
    std::fs::write(&out, b"").unwrap();
    let stop = PathBuf::from(format!("{out}.stop"));
    let until = Instant::now() + SNIFF_FOR;
    let mut heard = Vec::new();
    let mut buf = [0u8; 9000];
    while Instant::now() < until && !stop.exists() {
        if let Ok((len, _)) = socket.recv_from(&mut buf) {
            heard.extend_from_slice(&(len as u32).to_be_bytes());
            heard.extend_from_slice(&buf[..len]);
        }
    }
    std::fs::write(&out, &heard).unwrap();
    std::fs::write(format!("{out}.done"), b"").unwrap();
}

/// Kills a child on drop (the sniffer, when the test fails first).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The datagrams the sniffer recorded.
fn sniffed(path: &Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(path).unwrap_or_default();
    let mut packets = Vec::new();
    let mut rest = &bytes[..];
    while rest.len() >= 4 {
        let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        let Some(packet) = rest.get(4..4 + len) else {
            break;
        };
        packets.push(packet.to_vec());
        rest = &rest[4 + len..];
    }
    packets
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

#[test]
fn lan_send_and_receive_without_a_server() {
    if netns_tools::skip("lan_send_and_receive_without_a_server", &["ip"]) {
        return;
    }
    let started = Instant::now();
    let scratch = tempfile::Builder::new()
        .prefix("warren-lan-")
        .tempdir()
        .unwrap();
    let logs = scratch.path();
    let root = scratch.path().join("tree");
    let hashes = make_tree(&root);
    let lan = Lan::new();

    // `--lan` with `--server` is a usage error (clap's, before any socket), while the
    // WARREN_SERVER every child gets is not.
    let mut both = lan.spawn(
        &lan.sender,
        &[
            WARREN,
            "send",
            root.to_str().unwrap(),
            "--lan",
            "--server",
            "192.0.2.1:7000",
        ],
        logs,
        "lan-and-server",
    );
    let (status, _) = both.wait_exit(Duration::from_secs(10));
    let stderr = both.stderr_text();
    assert_eq!(status, 2, "--lan --server: {stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");

    // The sniffer first, so it hears the sender's first announcement.
    let sniff_out = scratch.path().join("sniffed");
    let test_binary = std::env::current_exe().unwrap();
    let sniffer = Command::new("ip")
        .args(["netns", "exec", &lan.receiver])
        .arg(&test_binary)
        .args([
            "--exact",
            "lan_sniffer_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SNIFF_ENV, &sniff_out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _sniffer = KillOnDrop(sniffer);
    let until = Instant::now() + Duration::from_secs(5);
    while !sniff_out.exists() {
        assert!(Instant::now() < until, "the sniffer did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    let root_arg = root.to_str().unwrap();
    let mut sender = lan.spawn(
        &lan.sender,
        &[WARREN, "send", root_arg, "--lan", "--json"],
        logs,
        "sender",
    );
    let code = sender.wait_event("code", Duration::from_secs(10))["code"]
        .as_str()
        .unwrap()
        .to_owned();
    let (nameplate, words) = code.split_once('-').unwrap();
    let words: Vec<&str> = words.split('-').collect();
    assert_eq!(words.len(), 3, "{code}");

    // Right number, wrong words; and a number nobody announces: both at once.
    let wrong_words = words
        .iter()
        .map(|w| if *w == "acid" { "acorn" } else { "acid" })
        .collect::<Vec<_>>()
        .join("-");
    let wrong_code = format!("{nameplate}-{wrong_words}");
    let other_nameplate = (nameplate.parse::<u32>().unwrap() + 1) % 10_000;
    let unknown_code = format!("{other_nameplate}-{}", words.join("-"));
    let out_wrong = scratch.path().join("out-wrong");
    let out_unknown = scratch.path().join("out-unknown");
    let lan_receive = |code: &str, out: &Path, name: &str| {
        lan.spawn(
            &lan.receiver,
            &[
                WARREN,
                "receive",
                code,
                "--lan",
                "--yes",
                "--json",
                "--out",
                out.to_str().unwrap(),
            ],
            logs,
            name,
        )
    };
    let wrong_started = Instant::now();
    let mut wrong = lan_receive(&wrong_code, &out_wrong, "wrong-code");
    let mut unknown = lan_receive(&unknown_code, &out_unknown, "unknown-number");

    let (status, events) = wrong.wait_exit(Duration::from_secs(20));
    let wrong_secs = wrong_started.elapsed().as_secs_f64();
    let stderr = wrong.stderr_text();
    assert_eq!(status, 1, "wrong code: {events:?}\n{stderr}");
    assert!(
        stderr.contains("the code does not match"),
        "wrong code: {stderr}"
    );
    assert!(
        !events.iter().any(|e| e["event"] == "connected"),
        "{events:?}"
    );
    assert_eq!(hash_tree(&out_wrong).len(), 0, "nothing may arrive");
    let notice = sender.wait_event("notice", Duration::from_secs(10));
    assert!(
        notice["message"]
            .as_str()
            .unwrap_or_default()
            .contains("failed the key exchange"),
        "{notice}"
    );

    // The right code, while the sender still waits.
    let out = scratch.path().join("out");
    let transfer_started = Instant::now();
    let mut receiver = lan_receive(&code, &out, "receiver");
    let (status, received) = receiver.wait_exit(EXIT_WITHIN);
    let receiver_stderr = receiver.stderr_text();
    assert_eq!(status, 0, "receiver: {received:?}\n{receiver_stderr}");
    let (status, sent) = sender.wait_exit(EXIT_WITHIN);
    let transfer_secs = transfer_started.elapsed().as_secs_f64();
    assert_eq!(status, 0, "sender: {sent:?}\n{}", sender.stderr_text());
    for (side, events) in [("sender", &sent), ("receiver", &received)] {
        let connected = events
            .iter()
            .find(|e| e["event"] == "connected")
            .unwrap_or_else(|| panic!("{side}: no connected event: {events:?}"));
        assert_eq!(connected["route"], "direct", "{side}: {connected}");
        let address = connected["address"].as_str().unwrap();
        let expected = if side == "sender" {
            RECEIVER_IP
        } else {
            SENDER_IP
        };
        assert!(
            address.starts_with(&format!("{expected}:")),
            "{side} connected to {address}"
        );
        let finished = events
            .iter()
            .find(|e| e["event"] == "finished")
            .unwrap_or_else(|| panic!("{side}: no finished event: {events:?}"));
        assert_eq!(finished["route"], "direct", "{side}: {finished}");
        assert_eq!(finished["files"], hashes.len(), "{side}: {finished}");
    }
    assert_eq!(
        hash_tree(&out.join("tree")),
        hashes,
        "the received tree differs"
    );

    // The number nobody announces: a bounded wait, then a message naming what to check.
    let (status, _) = unknown.wait_exit(Duration::from_secs(20));
    let stderr = unknown.stderr_text();
    assert_eq!(status, 1, "unknown number: {stderr}");
    assert!(
        stderr.contains(&format!("no sender with code number {other_nameplate}"))
            && stderr.contains("5353")
            && stderr.contains("--server"),
        "unknown number: {stderr}"
    );

    // What the network heard: the sender's records (its nameplate) and never a word.
    let stop_sniffing = |suffix: &str| PathBuf::from(format!("{}{suffix}", sniff_out.display()));
    std::fs::write(stop_sniffing(".stop"), b"").unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while !stop_sniffing(".done").exists() {
        assert!(Instant::now() < until, "the sniffer did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
    let packets = sniffed(&sniff_out);
    assert!(
        packets
            .iter()
            .any(|p| contains(p, format!("warren-{nameplate}").as_bytes())),
        "the sniffer heard no advertisement ({} packets)",
        packets.len()
    );
    // Words that could be in a packet by chance are not looked for: those within the
    // record's fixed names, and those of hex letters only (the PSK is hex).
    let fixed = format!("_warren-send._tcp.local. warren-{nameplate}.local. nameplate psk");
    let wrong_list: Vec<&str> = wrong_words.split('-').collect();
    let telling: Vec<&&str> = words
        .iter()
        .chain(wrong_list.iter())
        .filter(|w| !fixed.contains(**w) && !w.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect();
    assert!(!telling.is_empty());
    for word in telling {
        for packet in &packets {
            assert!(
                !contains(packet, word.as_bytes()),
                "a code word ({word}) went out in an mDNS packet"
            );
        }
    }
    eprintln!(
        "lan: wrong code refused in {wrong_secs:.1} s; tree of {} files sent direct in {transfer_secs:.1} s; {} mDNS packets heard, none with a word; {:.1} s in all",
        hashes.len(),
        packets.len(),
        started.elapsed().as_secs_f64()
    );
}
