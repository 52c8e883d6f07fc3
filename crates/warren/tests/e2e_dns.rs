//! End to end (issue 4): a real DNS server (dnsmasq) behind the real `warren` binary, queried
//! with `dig` through a UDP service, many queries at once.
//!
//! Needs `dnsmasq` (Debian `dnsmasq-base`) and `dig` (Debian `dnsutils`). Without them the
//! test prints a skip note, unless `WARREN_E2E_REQUIRE_TOOLS=1`, which makes it fail.
//! Everything listens on 127.0.0.1.

#[path = "support/ports.rs"]
mod ports;

use ports::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

const PSK: &str = "e2e-dns-psk-0123456789abcdef";
const TOKEN: &str = "e2e-dns-token-0123456789abcdef";
/// Names the local zone answers, and the answers.
const ZONE: [(&str, &str); 3] = [
    ("a.warren.test", "10.0.0.1"),
    ("b.warren.test", "10.0.0.2"),
    ("www.svc.warren.test", "10.11.12.13"),
];
const PARALLEL_QUERIES: usize = 60;

/// Kills the child process (by its own handle) when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "warren-e2e-dns-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn warren(dir: &Path, side: &str, config: &str) -> Killed {
    let path = dir.join(format!("{side}.toml"));
    std::fs::write(&path, config).unwrap();
    let log = std::fs::File::create(dir.join(format!("{side}.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_warren"))
        .args(["--log-level", "debug", side])
        .arg(&path)
        .env("WARREN_PSK", PSK)
        .env("WARREN_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the warren binary starts");
    Killed(child)
}

/// `dig @127.0.0.1 -p PORT NAME +short`: the answer lines, or `None` if dig failed.
///
/// dig's own `;;` notes are left out: an "ID mismatch" note means a late reply to an
/// earlier query reached a new dig that the OS gave the same port (UDP does that); dig
/// ignores that reply and goes on waiting for its own.
fn dig(dig: &Path, port: u16, name: &str) -> Option<String> {
    let output = Command::new(dig)
        .args(["@127.0.0.1", "-p", &port.to_string(), name, "A"])
        .args(["+short", "+tries=1", "+time=2"])
        .output()
        .ok()?;
    output.status.success().then(|| {
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| !line.starts_with(";;"))
            .collect::<Vec<_>>()
            .join("\n")
            .trim()
            .to_owned()
    })
}

/// Starts dnsmasq on a free port with the test zone and waits until it answers; retries
/// on another port if the chosen one was taken in the meantime.
fn start_dnsmasq(dnsmasq: &Path, dig_path: &Path, dir: &Path) -> (u16, Killed) {
    for _attempt in 0..5 {
        let dns_port = free_port();
        let mut args = vec![
            "--keep-in-foreground".to_owned(),
            "--no-resolv".to_owned(),
            "--no-hosts".to_owned(),
            "--log-facility=-".to_owned(),
            format!("--port={dns_port}"),
            "--listen-address=127.0.0.1".to_owned(),
            "--bind-interfaces".to_owned(),
            "--address=/svc.warren.test/10.11.12.13".to_owned(),
            // The zone is local: unknown names get NXDOMAIN, never a forward.
            "--local=/warren.test/".to_owned(),
            format!("--pid-file={}", dir.join("dnsmasq.pid").display()),
            "--user=root".to_owned(),
        ];
        for (name, ip) in &ZONE[..2] {
            args.push(format!("--host-record={name},{ip}"));
        }
        let log = std::fs::File::create(dir.join("dnsmasq.log")).unwrap();
        let mut child = Killed(
            Command::new(dnsmasq)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("dnsmasq starts"),
        );
        // dnsmasq answers directly before the tunnel is involved.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if dig(dig_path, dns_port, ZONE[0].0).as_deref() == Some(ZONE[0].1) {
                return (dns_port, child);
            }
            if child.0.try_wait().ok().flatten().is_some() {
                break; // exited (port taken?): try another port
            }
            assert!(
                Instant::now() < deadline,
                "dnsmasq did not answer within 10s; log in {}",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("dnsmasq failed to start 5 times; log in {}", dir.display());
}

/// dnsmasq and dig, or `None` (with a skip note) when they are missing and not required.
fn tools(what: &str) -> Option<(PathBuf, PathBuf)> {
    let (Some(dnsmasq), Some(dig_path)) = (tool("dnsmasq"), tool("dig")) else {
        let required = std::env::var("WARREN_E2E_REQUIRE_TOOLS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "dnsmasq and dig are required (apt-get install dnsmasq-base dnsutils)"
        );
        eprintln!(
            "SKIP {what} e2e DNS: dnsmasq or dig missing (apt-get install dnsmasq-base dnsutils)"
        );
        return None;
    };
    Some((dnsmasq, dig_path))
}

/// Starts dnsmasq, then a warren server and client whose `[server]` / `[client]` sections
/// are followed by the service tables `services(dns_port)` returns, and checks that dig on
/// 127.0.0.1:`query_port` gets dnsmasq's answers, many at once.
fn dig_through_the_tunnel(
    what: &str,
    query_port: u16,
    services: impl FnOnce(u16) -> (String, String),
) {
    dig_through_the_tunnel_over(what, "noise", query_port, services);
}

/// [`dig_through_the_tunnel`] over `transport`.
fn dig_through_the_tunnel_over(
    what: &str,
    transport: &str,
    query_port: u16,
    services: impl FnOnce(u16) -> (String, String),
) {
    let Some((dnsmasq, dig_path)) = tools(what) else {
        return;
    };
    let dir = temp_dir();
    let (dns_port, _dnsmasq) = start_dnsmasq(&dnsmasq, &dig_path, &dir);
    let server_port = free_port();
    let (server_services, client_services) = services(dns_port);
    let service_port = query_port;

    let _server = warren(
        &dir,
        "server",
        &format!(
            r#"[server]
bind = "127.0.0.1:{server_port}"
transport = "{transport}"
psk = "${{WARREN_PSK}}"
default_token = "${{WARREN_TOKEN}}"
heartbeat_interval = "1s"
{quic}
{server_services}"#,
            quic = quic_table(transport, &dir),
        ),
    );
    let _client = warren(
        &dir,
        "client",
        &format!(
            r#"[client]
server = "127.0.0.1:{server_port}"
transport = "{transport}"
psk = "${{WARREN_PSK}}"
default_token = "${{WARREN_TOKEN}}"
reconnect_initial_delay = "100ms"
reconnect_max_delay = "500ms"

{client_services}"#
        ),
    );
    // Until the client is connected queries go unanswered (UDP); poll, bounded.
    let deadline = Instant::now() + Duration::from_secs(20);
    while dig(&dig_path, service_port, ZONE[0].0).as_deref() != Some(ZONE[0].1) {
        assert!(
            Instant::now() < deadline,
            "no answer through the tunnel within 20s; logs in {}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Many queries at once, each from its own dig (its own visitor address).
    let started = Instant::now();
    let answers: Vec<(String, String, Option<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..PARALLEL_QUERIES)
            .map(|i| {
                let (name, ip) = ZONE[i % ZONE.len()];
                let dig_path = &dig_path;
                scope.spawn(move || {
                    // UDP may lose a query on a loaded machine: one more try, as a
                    // resolver would; a wrong answer is never retried away.
                    let answer = dig(dig_path, service_port, name)
                        .or_else(|| dig(dig_path, service_port, name));
                    (name.to_owned(), ip.to_owned(), answer)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = started.elapsed();
    let wrong: Vec<_> = answers
        .iter()
        .filter(|(_, ip, got)| got.as_deref() != Some(ip.as_str()))
        .collect();
    println!(
        "e2e dns: {}/{PARALLEL_QUERIES} parallel digs answered correctly in {elapsed:?}",
        PARALLEL_QUERIES - wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "wrong or missing answers: {wrong:?}; logs in {}",
        dir.display()
    );
    // An unknown name gets dnsmasq's empty answer (NXDOMAIN), not a timeout.
    assert_eq!(
        dig(&dig_path, service_port, "nope.warren.test").as_deref(),
        Some("")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `[server.quic]` for a QUIC server: the certificate in the test's directory.
fn quic_table(transport: &str, dir: &Path) -> String {
    if transport != "quic" {
        return String::new();
    }
    format!(
        "\n[server.quic]\ncert = \"{}\"\n",
        dir.join("quic.pem").display()
    )
}

/// Issue 14: the same over QUIC, whose UDP services ride as QUIC datagrams.
#[test]
fn issue14_dig_through_a_quic_tunnel_gets_dnsmasq_answers() {
    let service_port = free_port();
    dig_through_the_tunnel_over("issue14", "quic", service_port, |dns_port| {
        (
            format!(
                r#"[server.services.dns]
type = "udp"
bind = "127.0.0.1:{service_port}"
"#
            ),
            format!(
                r#"[client.services.dns]
type = "udp"
target = "127.0.0.1:{dns_port}"
"#
            ),
        )
    });
}

#[test]
fn issue4_dig_through_the_tunnel_gets_dnsmasq_answers() {
    let service_port = free_port();
    dig_through_the_tunnel("issue4", service_port, |dns_port| {
        (
            format!(
                r#"[server.services.dns]
type = "udp"
bind = "127.0.0.1:{service_port}"
udp_idle_timeout = "10s"
"#
            ),
            format!(
                r#"[client.services.dns]
type = "udp"
target = "127.0.0.1:{dns_port}"
udp_idle_timeout = "10s"
"#
            ),
        )
    });
}

/// Issue 5: the same through a UDP *forward* service: dig asks the client's port, the
/// server sends to the DNS server its own config names.
#[test]
fn issue5_dig_through_a_udp_forward_service_gets_dnsmasq_answers() {
    let local_port = free_port();
    dig_through_the_tunnel("issue5", local_port, |dns_port| {
        (
            format!(
                r#"[server.services.dns]
type = "udp"
target = "127.0.0.1:{dns_port}"
udp_idle_timeout = "10s"
"#
            ),
            format!(
                r#"[client.services.dns]
type = "udp"
bind = "127.0.0.1:{local_port}"
udp_idle_timeout = "10s"
"#
            ),
        )
    });
}
