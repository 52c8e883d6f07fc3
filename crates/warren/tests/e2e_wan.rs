//! The tunnel across an emulated internet path (issue 44): the WAN lab's W2 (20 ms each way,
//! 100 Mbit/s, 1 % random loss) between two network namespaces, the server and its visitors
//! in A, the client and its target (nginx) in B, so only the tunnel's own connections cross
//! the path. Both namespaces run Linux's usual default, cubic.
//!
//! What is checked is which congestion control each end really runs — read from the kernel
//! (`ss -ti` in each namespace) and from each side's admin API (the kernel's
//! `TCP_CONGESTION`, or quinn's controller asked of the connection) — and that a file fetched
//! through the tunnel arrives byte for byte. Not speed: that is `bench/run.sh --wan`'s.
//!
//! Needs root, `ip`, `nginx`, `curl` and `ss` and the `wanlab` binary built next to this
//! test (`cargo build --release` builds it); without them each test prints `SKIPPED` and
//! passes, unless `WARREN_NETNS_TESTS=1` (set by `scripts/test.sh`) makes that a failure.

mod e2e_support;
#[path = "support/netns_tools.rs"]
mod netns_tools;

use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use e2e_support::*;
use wanlab::{ADDR_A, Lab, LabOptions, Profile};

/// One lab at a time: each forwards at real-time priority, and two would share the cores.
static SERIAL: Mutex<()> = Mutex::new(());

const SERVER_PORT: u16 = 7000;
const SERVICE_PORT: u16 = 9000;
const SERVER_ADMIN: u16 = 9001;
const CLIENT_ADMIN: u16 = 9002;
const TARGET_PORT: u16 = 8080;
/// Big enough that the transfer spans many round trips and losses, small enough to take a
/// few seconds even under cubic's 4 Mbit/s.
const FILE_LEN: usize = 6 * 1024 * 1024;

fn skip(test: &str) -> bool {
    netns_tools::skip(test, &["ip", "nginx", "curl", "ss"])
}

/// A W2 lab with `lo` up in both namespaces (the tunnel's local ends listen there).
fn w2_lab() -> Lab {
    let options = LabOptions::new(Profile::by_name("W2").expect("W2"));
    let lab = Lab::start_with(options).expect("the WAN lab starts");
    for ns in [&lab.ns_a, &lab.ns_b] {
        netns_tools::run(&["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]);
        let cc = output(&[
            "ip",
            "netns",
            "exec",
            ns,
            "sysctl",
            "-n",
            "net.ipv4.tcp_congestion_control",
        ]);
        assert_eq!(cc.trim(), "cubic", "the lab sets cubic in {ns}");
    }
    lab
}

fn output(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `program args..` started inside `ns`.
fn spawn_in(dir: &TestDir, name: &str, ns: &str, program: &str, args: &[&str]) -> Proc {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    // `ip netns exec` execs the program: the PID is the program's.
    Proc::spawn(dir, name, "ip", &all, &[])
}

/// A server in A and a client in B with `server_extra` / `client_extra` added to their
/// `[server]` / `[client]` tables; nginx in B serving `blob`.
struct Tunnel {
    dir: TestDir,
    blob: Vec<u8>,
    _procs: Vec<Proc>,
}

fn tunnel(lab: &Lab, name: &str, server_extra: &str, client_extra: &str) -> Tunnel {
    tunnel_with(lab, name, (server_extra, ""), client_extra)
}

/// [`tunnel`], with `server_tables` (e.g. `[server.quic]`) at the end of the server's config.
fn tunnel_with(
    lab: &Lab,
    name: &str,
    (server_extra, server_tables): (&str, &str),
    client_extra: &str,
) -> Tunnel {
    let dir = TestDir::new(name);
    let blob = random_bytes(FILE_LEN);
    std::fs::write(dir.path().join("blob"), &blob).expect("write blob");
    let server = dir.write(
        "server.toml",
        &format!(
            "[server]\nbind = \"{ADDR_A}:{SERVER_PORT}\"\npsk = \"{PSK}\"\ndefault_token = \"{TOKEN}\"\n{server_extra}\n\
             [admin]\nbind = \"127.0.0.1:{SERVER_ADMIN}\"\n\
             [server.services.web]\nbind = \"127.0.0.1:{SERVICE_PORT}\"\n{server_tables}"
        ),
    );
    let client = dir.write(
        "client.toml",
        &format!(
            "[client]\nserver = \"{ADDR_A}:{SERVER_PORT}\"\npsk = \"{PSK}\"\ndefault_token = \"{TOKEN}\"\n{client_extra}\n\
             [admin]\nbind = \"127.0.0.1:{CLIENT_ADMIN}\"\n\
             [client.services.web]\ntarget = \"127.0.0.1:{TARGET_PORT}\"\n"
        ),
    );
    let nginx_conf = dir.write(
        "nginx.conf",
        &format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {root}/nginx.pid;\nerror_log {root}/nginx.error.log warn;\n\
             events {{ worker_connections 64; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {root}/body;\n  proxy_temp_path {root}/proxy;\n  \
             fastcgi_temp_path {root}/fastcgi;\n  uwsgi_temp_path {root}/uwsgi;\n  scgi_temp_path {root}/scgi;\n  default_type application/octet-stream;\n  \
             server {{ listen 127.0.0.1:{TARGET_PORT}; root {root}; }}\n}}\n",
            root = dir.path().display()
        ),
    );
    let nginx = if std::path::Path::new("/usr/sbin/nginx").is_file() {
        "/usr/sbin/nginx"
    } else {
        "nginx"
    };
    let procs = vec![
        spawn_in(
            &dir,
            "nginx",
            &lab.ns_b,
            nginx,
            &["-c", nginx_conf.to_str().unwrap(), "-e", "stderr"],
        ),
        spawn_in(
            &dir,
            "server",
            &lab.ns_a,
            WARREN,
            &["server", server.to_str().unwrap()],
        ),
        spawn_in(
            &dir,
            "client",
            &lab.ns_b,
            WARREN,
            &["client", client.to_str().unwrap()],
        ),
    ];
    let tunnel = Tunnel {
        dir,
        blob,
        _procs: procs,
    };
    tunnel.wait_ready(lab);
    tunnel
}

impl Tunnel {
    /// Until the server's `/readyz` says every service has a client (at most
    /// [`LISTEN_TIMEOUT`] and a handshake across the path).
    fn wait_ready(&self, lab: &Lab) {
        let deadline = Instant::now() + LISTEN_TIMEOUT + Duration::from_secs(10);
        let url = format!("http://127.0.0.1:{SERVER_ADMIN}/readyz");
        loop {
            let status = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &lab.ns_a,
                    "curl",
                    "-sf",
                    "-o",
                    "/dev/null",
                    "--max-time",
                    "5",
                    &url,
                ])
                .status()
                .expect("curl runs");
            if status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the tunnel was not ready within {:?}:\n{}",
                LISTEN_TIMEOUT,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn logs(&self) -> String {
        ["server", "client", "nginx"]
            .iter()
            .map(|name| {
                let read = |ext| {
                    std::fs::read_to_string(self.dir.path().join(format!("{name}.1.{ext}")))
                        .unwrap_or_default()
                };
                format!("--- {name}\n{}{}", read("stdout"), read("stderr"))
            })
            .collect()
    }

    /// Fetches the blob through the tunnel from A and checks every byte.
    fn fetch_exact(&self, lab: &Lab) {
        let out = self.dir.path().join("fetched");
        let url = format!("http://127.0.0.1:{SERVICE_PORT}/blob");
        // Generous: a slow machine and cubic at 1 % loss may take a while; it only has
        // to arrive.
        let status = Command::new("ip")
            .args([
                "netns",
                "exec",
                &lab.ns_a,
                "curl",
                "-sf",
                "--max-time",
                "300",
                "-o",
            ])
            .arg(&out)
            .arg(&url)
            .status()
            .expect("curl runs");
        assert!(
            status.success(),
            "fetch through the tunnel failed ({status}):\n{}",
            self.logs()
        );
        let got = std::fs::read(&out).expect("read fetched file");
        assert_eq!(got.len(), self.blob.len(), "length of the fetched file");
        assert!(
            got == self.blob,
            "the fetched file differs from the served one"
        );
    }

    /// The `congestion` of every session in the admin API at `port` inside `ns`.
    fn admin_congestion(&self, ns: &str, port: u16) -> Vec<String> {
        let url = format!("http://127.0.0.1:{port}/api/v1/sessions");
        let body = output(&[
            "ip",
            "netns",
            "exec",
            ns,
            "curl",
            "-sf",
            "--max-time",
            "5",
            &url,
        ]);
        let json: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("sessions from {url}: {e}: {body}\n{}", self.logs()));
        json.as_array()
            .unwrap_or_else(|| panic!("sessions from {url} are not a list: {body}"))
            .iter()
            .map(|s| s["congestion"].as_str().unwrap_or("none").to_owned())
            .collect()
    }
}

/// The congestion control of every established TCP connection in `ns` with `port` at
/// `end` (`sport` or `dport`), as the kernel reports it (`ss -ti`).
fn kernel_congestion(ns: &str, end: &str, port: u16) -> Vec<String> {
    let filter = format!("( {end} = :{port} )");
    let text = output(&[
        "ip",
        "netns",
        "exec",
        ns,
        "ss",
        "-tin",
        "state",
        "established",
        &filter,
    ]);
    const KNOWN: [&str; 6] = ["cubic", "bbr", "reno", "htcp", "vegas", "westwood"];
    text.lines()
        .filter_map(|line| line.split_whitespace().find(|w| KNOWN.contains(w)))
        .map(str::to_owned)
        .collect()
}

fn all_are(seen: &[String], want: &str) -> bool {
    !seen.is_empty() && seen.iter().all(|s| s == want)
}

#[test]
fn the_default_config_runs_bbr_on_both_ends_of_a_lossy_path() {
    if skip("the_default_config_runs_bbr_on_both_ends_of_a_lossy_path") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = w2_lab();
    // No transport or congestion keys at all.
    let tunnel = tunnel(&lab, "wan-default", "", "");
    tunnel.fetch_exact(&lab);
    let server_side = kernel_congestion(&lab.ns_a, "sport", SERVER_PORT);
    let client_side = kernel_congestion(&lab.ns_b, "dport", SERVER_PORT);
    assert!(
        all_are(&server_side, "bbr"),
        "server's tunnel sockets: {server_side:?}"
    );
    assert!(
        all_are(&client_side, "bbr"),
        "client's tunnel sockets: {client_side:?}"
    );
    let server_api = tunnel.admin_congestion(&lab.ns_a, SERVER_ADMIN);
    let client_api = tunnel.admin_congestion(&lab.ns_b, CLIENT_ADMIN);
    assert!(
        all_are(&server_api, "bbr"),
        "server's admin API: {server_api:?}"
    );
    assert!(
        all_are(&client_api, "bbr"),
        "client's admin API: {client_api:?}"
    );
    // The visitor's and the target's connections are the user's: left at the default.
    let visitor = kernel_congestion(&lab.ns_a, "sport", SERVICE_PORT);
    assert!(
        all_are(&visitor, "cubic") || visitor.is_empty(),
        "visitor sockets: {visitor:?}"
    );
    let stats = lab.stats().expect("lab stats");
    eprintln!(
        "W2 lab: {} random and {} queue drops server→client, {} random client→server",
        stats.b_to_a.random_drops, stats.b_to_a.queue_drops, stats.a_to_b.random_drops
    );
    assert!(
        stats.b_to_a.random_drops > 0,
        "the path lost nothing: not W2"
    );
}

#[test]
fn tcp_congestion_overrides_the_default_on_each_end() {
    if skip("tcp_congestion_overrides_the_default_on_each_end") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = w2_lab();
    let tunnel = tunnel(
        &lab,
        "wan-override",
        "tcp_congestion = \"system\"",
        "tcp_congestion = \"reno\"",
    );
    tunnel.fetch_exact(&lab);
    let server_side = kernel_congestion(&lab.ns_a, "sport", SERVER_PORT);
    let client_side = kernel_congestion(&lab.ns_b, "dport", SERVER_PORT);
    assert!(
        all_are(&server_side, "cubic"),
        "server (system default): {server_side:?}"
    );
    assert!(
        all_are(&client_side, "reno"),
        "client (reno): {client_side:?}"
    );
    assert_eq!(tunnel.admin_congestion(&lab.ns_a, SERVER_ADMIN), ["cubic"]);
    assert_eq!(tunnel.admin_congestion(&lab.ns_b, CLIENT_ADMIN), ["reno"]);
}

#[test]
fn quic_sessions_report_the_controller_each_end_runs() {
    if skip("quic_sessions_report_the_controller_each_end_runs") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = w2_lab();
    // Each end picks its own controller for what it sends: quinn's BBR on the server only;
    // the client keeps Warren's default, `model`.
    let quic = format!("{}congestion = \"bbr\"\n", quic_server_table("quic"));
    let server = ("transport = \"quic\"", quic.as_str());
    let tunnel = tunnel_with(&lab, "wan-quic", server, "transport = \"quic\"");
    tunnel.fetch_exact(&lab);
    assert_eq!(tunnel.admin_congestion(&lab.ns_a, SERVER_ADMIN), ["bbr"]);
    assert_eq!(tunnel.admin_congestion(&lab.ns_b, CLIENT_ADMIN), ["model"]);
    assert!(
        kernel_congestion(&lab.ns_b, "dport", SERVER_PORT).is_empty(),
        "a QUIC session opens no TCP connection to the server"
    );
}
