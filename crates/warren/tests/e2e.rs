//! End-to-end tests: the real `warren` binary, started as `warren server FILE` and
//! `warren client FILE` child processes with configs in a fresh temp dir, on 127.0.0.1 ports
//! picked by binding port 0. Bytes are checked by BLAKE3 hash in both directions.
//!
//! Run them against the release binary: `cargo test --release -p warren --test e2e`.
//! The iperf3 test needs `iperf3` on PATH; it is skipped without it unless
//! `WARREN_E2E_REQUIRE_TOOLS=1` is set (as `scripts/test.sh` does), which makes it fail.

mod e2e_support;

use std::net::SocketAddr;
use std::time::Duration;

use e2e_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const MIB: usize = 1024 * 1024;

// ---------------------------------------------------------------------------------------
// Throughput and integrity

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iperf3_runs_through_the_tunnel_in_both_directions() {
    if !tool_on_path("iperf3") {
        if std::env::var("WARREN_E2E_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!(
                "iperf3 is not on PATH but WARREN_E2E_REQUIRE_TOOLS=1: install it (apt-get install iperf3)"
            );
        }
        eprintln!(
            "SKIPPED iperf3_runs_through_the_tunnel_in_both_directions: iperf3 is not on PATH (apt-get install iperf3)"
        );
        return;
    }
    iperf3_both_ways(Setup::default(), "iperf3").await;
}

/// Issue 14: iperf3 through a QUIC tunnel, both directions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iperf3_runs_through_a_quic_tunnel_in_both_directions() {
    if !tool_on_path("iperf3") {
        assert!(
            std::env::var_os("WARREN_E2E_REQUIRE_TOOLS").is_none(),
            "iperf3 is not on PATH but WARREN_E2E_REQUIRE_TOOLS=1: install it (apt-get install iperf3)"
        );
        eprintln!("SKIPPED iperf3 over QUIC: iperf3 is not on PATH (apt-get install iperf3)");
        return;
    }
    let setup = Setup {
        transport: "quic",
        ..Setup::default()
    };
    iperf3_both_ways(setup, "iperf3-quic").await;
}

/// iperf3 one way then the other through a tunnel set up as `setup` says.
async fn iperf3_both_ways(setup: Setup, name: &str) {
    let dir = TestDir::new(name);
    let iperf_port = free_port();
    let tunnel = Tunnel::to(loopback(iperf_port))
        .setup(setup)
        .start(&dir)
        .await;
    for (label, reverse) in [
        ("visitor -> target", false),
        ("target -> visitor (-R)", true),
    ] {
        let args: &[&str] = if reverse {
            &["-t", "2", "-R"]
        } else {
            &["-t", "2"]
        };
        let bits = iperf3(&dir, &tunnel, iperf_port, args, label).await;
        assert!(bits > 0.0, "iperf3 {label}: no bytes received");
        eprintln!("iperf3 through warren, {label}: {:.2} Gbit/s", bits / 1e9);
    }
}

/// Runs one iperf3 test (client `args` added) through `tunnel`'s `web` service to an iperf3
/// server on `iperf_port`; returns what the receiver measured, bits per second.
async fn iperf3(
    dir: &TestDir,
    tunnel: &Tunnel,
    iperf_port: u16,
    args: &[&str],
    label: &str,
) -> f64 {
    let service_port = tunnel.ports.web.to_string();
    let iperf_port = iperf_port.to_string();
    // `-1`: the iperf3 server serves one test and exits.
    let mut iperf_server = Proc::spawn(
        dir,
        "iperf3-server",
        "iperf3",
        &[
            "-s",
            "-B",
            "127.0.0.1",
            "-p",
            &iperf_port,
            "-1",
            "--forceflush",
        ],
        &[],
    );
    iperf_server
        .wait_stdout("Server listening", Duration::from_secs(5))
        .await;
    let mut client_args = vec![
        "-c",
        "127.0.0.1",
        "-p",
        &service_port,
        "-J",
        "--connect-timeout",
        "5000",
    ];
    client_args.extend_from_slice(args);
    let mut iperf_client = Proc::spawn(dir, "iperf3-client", "iperf3", &client_args, &[]);
    let code = iperf_client.expect_exit(Duration::from_secs(60)).await;
    let json = iperf_client.stdout();
    assert_eq!(
        code,
        0,
        "iperf3 {label} failed\n{}\n{}",
        iperf_client.logs(),
        tunnel.logs()
    );
    let bits = receiver_bits_per_second(&json)
        .unwrap_or_else(|e| panic!("iperf3 {label}: {e}\n{json}\n{}", tunnel.logs()));
    assert!(
        iperf_server
            .wait_exit(Duration::from_secs(5))
            .await
            .is_some(),
        "iperf3 -s -1 did not exit after its test"
    );
    bits
}

/// Issue 19: `bandwidth_limit = "10MB/s"` on the client's service holds iperf3 within
/// ±10 % of 80 Mbit/s over 10 s, with one stream one way and eight streams the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_10_mb_per_second_limit_holds_within_10_percent_for_one_and_eight_streams() {
    if !tool_on_path("iperf3") {
        assert!(
            std::env::var_os("WARREN_E2E_REQUIRE_TOOLS").is_none(),
            "iperf3 is not on PATH but WARREN_E2E_REQUIRE_TOOLS=1: install it (apt-get install iperf3)"
        );
        eprintln!(
            "SKIPPED the bandwidth limit test: iperf3 is not on PATH (apt-get install iperf3)"
        );
        return;
    }
    let dir = TestDir::new("bandwidth");
    let iperf_port = free_port();
    let setup = Setup {
        client_web: "bandwidth_limit = \"10MB/s\"\n".into(),
        ..Setup::default()
    };
    let tunnel = Tunnel::to(loopback(iperf_port))
        .setup(setup)
        .start(&dir)
        .await;
    for (label, args) in [
        ("1 stream, visitor -> target", &["-t", "10"][..]),
        (
            "8 streams, target -> visitor",
            &["-t", "10", "-P", "8", "-R"][..],
        ),
    ] {
        let bits = iperf3(&dir, &tunnel, iperf_port, args, label).await;
        let megabytes = bits / 8e6;
        eprintln!("iperf3 through a 10 MB/s limit, {label}: {megabytes:.2} MB/s");
        assert!(
            (9.0..=11.0).contains(&megabytes),
            "{label}: {megabytes:.2} MB/s, not within 10 % of the 10 MB/s limit\n{}",
            tunnel.logs()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_payloads_64_mib_each_way_over_32_concurrent_visitors() {
    let dir = TestDir::new("payloads");
    let (target, mut served) = hashing_target(2 * MIB).await;
    let tunnel = Tunnel::to(target).start(&dir).await;
    let started = Instant::now();
    let (up, down) = hashed_transfers(tunnel.service(), &mut served, 32, 2 * MIB, 2 * MIB).await;
    let elapsed = started.elapsed();
    assert!(up >= 64 * MIB && down >= 64 * MIB, "up {up}, down {down}");
    eprintln!(
        "32 visitors moved {} MiB up and {} MiB down in {elapsed:.2?} (default cipher)",
        up / MIB,
        down / MIB
    );
}

/// Issue 14: the same payload check over QUIC, every visitor a QUIC stream of one
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_payloads_over_quic_32_concurrent_visitors() {
    let dir = TestDir::new("payloads-quic");
    let (target, mut served) = hashing_target(MIB).await;
    let setup = Setup {
        transport: "quic",
        ..Setup::default()
    };
    let tunnel = Tunnel::to(target).setup(setup).start(&dir).await;
    let started = Instant::now();
    let (up, down) = hashed_transfers(tunnel.service(), &mut served, 32, MIB, MIB).await;
    let elapsed = started.elapsed();
    assert!(up >= 32 * MIB && down >= 32 * MIB, "up {up}, down {down}");
    eprintln!(
        "32 visitors moved {} MiB up and {} MiB down over QUIC in {elapsed:.2?}",
        up / MIB,
        down / MIB
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cipher_carries_random_payloads_both_ways() {
    let (target, mut served) = hashing_target(MIB / 2).await;
    for cipher in [
        "aes-128-gcm",
        "aes-256-gcm",
        "chacha20-poly1305",
        "aegis-128l",
        "aegis-256",
    ] {
        let dir = TestDir::new(cipher);
        let tunnel = Tunnel::to(target).cipher(cipher).start(&dir).await;
        hashed_transfers(tunnel.service(), &mut served, 8, MIB / 2, MIB / 2).await;
        // The session really used the configured cipher.
        let client_log = tunnel.client.stderr();
        assert!(
            client_log.contains(&format!("cipher={cipher}")),
            "{cipher}: the client log does not show the negotiated cipher\n{}",
            tunnel.logs()
        );
    }
}

/// `--workers 1` (server) and `WARREN_WORKERS=1` (client) run each side on one thread (a
/// current-thread runtime): everything still flows, many visitors at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_thread_per_side_carries_random_payloads_both_ways() {
    let dir = TestDir::new("one-worker");
    let (target, mut served) = hashing_target(MIB / 2).await;
    let setup = Setup::default();
    let ports = Ports::pick();
    let probe_target = echo_target().await;
    let server_config = dir.write("server.toml", &server_toml(&setup, ports));
    let client_config = dir.write(
        "client.toml",
        &client_toml(&setup, ports, target, probe_target),
    );
    let server = Proc::warren(
        &dir,
        "server",
        &["--workers", "1", "server", server_config.to_str().unwrap()],
        &[("WARREN_PSK", PSK)],
    );
    let client = Proc::warren(
        &dir,
        "client",
        &["client", client_config.to_str().unwrap()],
        &[("WARREN_PSK", PSK), ("WARREN_WORKERS", "1")],
    );
    let mut tunnel = Tunnel {
        server,
        client,
        ports,
        server_config,
        client_config,
        setup,
    };
    tunnel.wait_ready().await;
    hashed_transfers(tunnel.service(), &mut served, 16, MIB / 2, MIB / 2).await;
}

// ---------------------------------------------------------------------------------------
// Refusals

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_psk_never_carries_a_byte_and_the_server_stays_up() {
    let dir = TestDir::new("wrong-psk");
    let (target, mut served) = hashing_target(64 * 1024).await;
    let mut tunnel = Tunnel::to(target)
        .setup(Setup {
            client_psk: "a-different-psk-0123456789-xyz".into(),
            ..Setup::default()
        })
        .spawn(&dir)
        .await;

    // For ~3 s, visitors get closed (EOF or reset) at once, without a byte.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut visits = 0;
    while Instant::now() < deadline && visits < 50 {
        visits += 1;
        let visit = async {
            let mut visitor = TcpStream::connect(tunnel.service()).await?;
            visitor.write_all(b"hello?").await?;
            let mut reply = Vec::new();
            visitor.read_to_end(&mut reply).await?;
            std::io::Result::Ok(reply)
        };
        match tokio::time::timeout(Duration::from_secs(2), visit).await {
            Ok(Ok(reply)) => assert!(
                reply.is_empty(),
                "a visitor got {} bytes through a client with the wrong PSK\n{}",
                reply.len(),
                tunnel.logs()
            ),
            Ok(Err(_reset)) => {}
            Err(_) => panic!(
                "a visitor was held open for 2s instead of being closed\n{}",
                tunnel.logs()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        served.try_recv().is_err(),
        "the target was reached through a client with the wrong PSK"
    );
    assert!(
        tunnel
            .client
            .stderr_contains_within("the PSKs probably differ", Duration::from_secs(2))
            .await,
        "the client log does not say the PSKs probably differ\n{}",
        tunnel.client.logs()
    );
    assert!(
        tunnel.server.is_running(),
        "the server died\n{}",
        tunnel.logs()
    );

    // A client with the right PSK still gets through (the wrong one keeps retrying).
    let wrong_client = std::mem::replace(
        &mut tunnel.client,
        start_client(&dir, &tunnel.client_config, PSK),
    );
    tunnel.wait_ready().await;
    hashed_transfers(tunnel.service(), &mut served, 4, 256 * 1024, 64 * 1024).await;
    drop(wrong_client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_stops_the_client_and_the_server_logs_the_peer() {
    let dir = TestDir::new("wrong-token");
    let echo = echo_target().await;
    let mut tunnel = Tunnel::to(echo)
        .setup(Setup {
            client_token: "not-the-right-token-0123456789".into(),
            ..Setup::default()
        })
        .spawn(&dir)
        .await;

    let code = tunnel.client.expect_exit(Duration::from_secs(10)).await;
    assert_eq!(code, 1, "client exit code\n{}", tunnel.logs());
    let client_log = tunnel.client.stderr();
    assert!(
        client_log.contains("refused") && client_log.contains("wrong token"),
        "the client does not say the server refused the service (wrong token)\n{client_log}"
    );
    assert!(
        tunnel
            .server
            .stderr_contains_within("wrong token", Duration::from_secs(2))
            .await,
        "the server log does not mention the wrong token\n{}",
        tunnel.server.logs()
    );
    let server_log = tunnel.server.stderr();
    let line = server_log
        .lines()
        .find(|line| line.contains("wrong token"))
        .unwrap_or_default();
    assert!(
        line.contains("127.0.0.1"),
        "the server's wrong-token line does not name the client's address: {line}"
    );
    assert!(!server_log.contains(TOKEN), "the server logged a token");
    assert!(tunnel.server.is_running(), "the server died");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_needs_insecure_and_then_carries_bytes() {
    let dir = TestDir::new("plaintext");
    let plaintext = Setup {
        transport: "tcp",
        ..Setup::default()
    };
    let ports = Ports::pick();
    let server_file = dir.write("server.toml", &server_toml(&plaintext, ports));
    let client_file = dir.write(
        "client.toml",
        &client_toml(&plaintext, ports, loopback(1), loopback(1)),
    );
    let (server_file, client_file) = (server_file.to_str().unwrap(), client_file.to_str().unwrap());
    let psk = [("WARREN_PSK", PSK)];
    for (args, expected) in [
        (["server", server_file], 2),
        (["client", client_file], 2),
        (["check", server_file], 1),
        (["check", client_file], 1),
    ] {
        let (code, _, stderr) = Proc::warren_output(&dir, "refused", &args, &psk).await;
        assert_eq!(code, expected, "warren {args:?}: exit code\n{stderr}");
        assert!(
            stderr.contains("insecure"),
            "warren {args:?} does not mention insecure\n{stderr}"
        );
    }

    let insecure = Setup {
        insecure: true,
        ..plaintext
    };
    let (target, mut served) = hashing_target(MIB).await;
    let tunnel = Tunnel::to(target).setup(insecure).start(&dir).await;
    hashed_transfers(tunnel.service(), &mut served, 4, MIB, MIB).await;
}

// ---------------------------------------------------------------------------------------
// Config errors

#[tokio::test]
async fn bad_config_reports_every_key_with_its_line_and_exits_2() {
    let dir = TestDir::new("bad-config");
    let path = dir.write(
        "bad.toml",
        &format!(
            r#"[server]
bind = "127.0.0.1:notaport"
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
heartbeat_interval = "10 parsecs"
colour = "blue"

[server.services.web]
bind = "127.0.0.1:{}"
"#,
            free_port()
        ),
    );
    let file = path.to_str().unwrap();
    let psk = [("WARREN_PSK", PSK)];
    for (args, expected) in [(["server", file], 2), (["check", file], 1)] {
        let (code, _, stderr) = Proc::warren_output(&dir, "bad", &args, &psk).await;
        assert_eq!(code, expected, "warren {args:?}: exit code\n{stderr}");
        for (line, key) in [
            (2, "server.bind"),
            (5, "server.heartbeat_interval"),
            (6, "server.colour"),
        ] {
            let prefix = format!("{file}:{line}:");
            assert!(
                stderr
                    .lines()
                    .any(|l| l.starts_with(&prefix) && l.contains(key)),
                "warren {args:?}: no `{prefix}...{key}` line\n{stderr}"
            );
        }
        assert!(!stderr.contains(PSK), "the error output shows the PSK");
    }

    let missing = dir.path().join("does-not-exist.toml");
    let missing = missing.to_str().unwrap();
    for command in ["server", "client"] {
        let (code, _, stderr) =
            Proc::warren_output(&dir, "missing", &[command, missing], &psk).await;
        assert_eq!(code, 2, "warren {command} MISSING: exit code\n{stderr}");
        assert!(
            stderr.contains(missing),
            "warren {command}: the message does not name {missing}\n{stderr}"
        );
    }
}

#[tokio::test]
async fn example_configs_are_refused_for_their_change_me_tokens() {
    let dir = TestDir::new("examples");
    for example in [
        "server.toml",
        "client.toml",
        "ha-server.toml",
        "ha-client.toml",
    ] {
        let path = format!("{}/../../examples/{example}", env!("CARGO_MANIFEST_DIR"));
        let (code, stdout, stderr) =
            Proc::warren_output(&dir, "check", &["check", &path], &[("WARREN_PSK", PSK)]).await;
        assert_eq!(code, 1, "warren check {example}\n{stdout}\n{stderr}");
        assert!(
            stderr.contains("CHANGE-ME"),
            "warren check {example} does not mention the CHANGE-ME placeholder\n{stderr}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Restarts and shutdown

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reconnects_after_a_server_restart_and_a_cut_upload_is_an_error() {
    let dir = TestDir::new("restart");
    let (target, mut served) = hashing_target(MIB).await;
    let mut tunnel = Tunnel::to(target).start(&dir).await;
    hashed_transfers(tunnel.service(), &mut served, 4, MIB, MIB).await;
    let client_pid = tunnel.client.pid();

    // An upload in flight when the server is killed must not end as a clean, short stream.
    let payload = random_bytes(64 * MIB);
    let mut visitor = TcpStream::connect(tunnel.service()).await.unwrap();
    visitor.write_all(&payload[..2 * MIB]).await.unwrap();
    tunnel.server.kill();
    let rest = async {
        for chunk in payload[2 * MIB..].chunks(256 * 1024) {
            visitor.write_all(chunk).await?;
        }
        visitor.shutdown().await?;
        let mut reply = Vec::new();
        visitor.read_to_end(&mut reply).await?;
        std::io::Result::Ok(reply)
    };
    let outcome = tokio::time::timeout(Duration::from_secs(10), rest)
        .await
        .unwrap_or_else(|_| panic!("the cut visitor hung for 10s\n{}", tunnel.logs()));
    if let Ok(reply) = outcome {
        let report = served.try_recv().unwrap_or_else(|_| {
            panic!(
                "a visitor cut by a server crash saw a clean EOF after {} reply bytes",
                reply.len()
            )
        });
        assert_eq!(report.received, blake3::hash(&payload), "short upload");
        assert_eq!(report.sent, blake3::hash(&reply), "short clean reply");
    }
    // The cut reaches the target as an error too: it must not take a short upload for a
    // whole one (it only reports uploads that ended with a clean EOF).
    tokio::time::sleep(Duration::from_millis(500)).await;
    if let Ok(report) = served.try_recv() {
        assert_eq!(
            report.received,
            blake3::hash(&payload),
            "the target saw the cut upload end with a clean EOF\n{}",
            tunnel.logs()
        );
    }

    tunnel.restart_server(&dir);
    tunnel.wait_ready().await;
    assert_eq!(tunnel.client.pid(), client_pid);
    assert!(tunnel.client.is_running(), "the client exited");
    hashed_transfers(tunnel.service(), &mut served, 4, MIB, MIB).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_server_and_client_and_they_exit_with_code_0() {
    let dir = TestDir::new("sigterm");
    let echo = echo_target().await;
    let mut tunnel = Tunnel::to(echo).start(&dir).await;
    // SIGTERM drains (issue 43): an open visitor holds both sides until it ends (or their
    // drain_timeout), then they exit at once.
    let mut visitor = TcpStream::connect(tunnel.service()).await.unwrap();
    visitor.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), visitor.read_exact(&mut buf))
        .await
        .expect("echo within 5s")
        .expect("echo");
    assert_eq!(&buf, b"ping");

    tunnel.server.terminate();
    tunnel.client.terminate();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (name, proc) in [
        ("server", &mut tunnel.server),
        ("client", &mut tunnel.client),
    ] {
        assert!(
            proc.is_running(),
            "{name} stopped with a visitor open instead of draining\n{}",
            proc.logs()
        );
    }
    // The visitor still gets its bytes while they drain, then leaves.
    visitor.write_all(b"pong").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), visitor.read_exact(&mut buf))
        .await
        .expect("echo within 5s while draining")
        .expect("echo while draining");
    assert_eq!(&buf, b"pong");
    drop(visitor);
    for (name, proc) in [
        ("server", &mut tunnel.server),
        ("client", &mut tunnel.client),
    ] {
        let status = proc.wait_exit(Duration::from_secs(10)).await;
        assert!(
            status.is_some(),
            "{name} did not exit within 10s of its last stream's end\n{}",
            proc.logs()
        );
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "{name} exit after SIGTERM\n{}",
            proc.logs()
        );
    }
}

// ---------------------------------------------------------------------------------------
// keygen and demo

#[tokio::test]
async fn keygen_prints_a_fresh_psk_and_token() {
    let dir = TestDir::new("keygen");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let (code, stdout, stderr) = Proc::warren_output(&dir, "keygen", &["keygen"], &[]).await;
        assert_eq!(code, 0, "{stderr}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 2, "keygen output:\n{stdout}");
        for (line, key) in lines.iter().zip(["psk", "default_token"]) {
            let value = line
                .strip_prefix(&format!("{key} = \""))
                .and_then(|rest| rest.strip_suffix('"'))
                .unwrap_or_else(|| panic!("not a `{key} = \"...\"` line: {line}"));
            assert_eq!(value.len(), 32, "{line}");
            assert!(
                value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
                "{line}"
            );
            seen.push(value.to_owned());
        }
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        seen.len(),
        "keygen repeated a secret: {seen:?}"
    );
}

#[tokio::test]
async fn demo_serves_its_page_through_the_tunnel_and_stops_on_sigterm() {
    let dir = TestDir::new("demo");
    let mut demo = Proc::warren(&dir, "demo", &["demo", "--port", "0"], &[]);
    let stdout = demo
        .wait_stdout("http://127.0.0.1:", Duration::from_secs(10))
        .await;
    let url_start = stdout.find("http://127.0.0.1:").unwrap();
    let url: String = stdout[url_start..]
        .chars()
        .take_while(|c| !c.is_whitespace())
        .collect();
    let port: u16 = url
        .trim_start_matches("http://127.0.0.1:")
        .trim_end_matches('/')
        .parse()
        .unwrap_or_else(|e| panic!("bad demo URL {url}: {e}"));
    assert_ne!(port, 0, "{url}");
    assert!(url.ends_with('/'), "{url}");

    let get = async {
        let mut stream = TcpStream::connect(loopback(port)).await?;
        stream
            .write_all(
                format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        std::io::Result::Ok(String::from_utf8_lossy(&response).into_owned())
    };
    let response = tokio::time::timeout(Duration::from_secs(10), get)
        .await
        .expect("the demo page answers within 10s")
        .expect("GET the demo page");
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "demo page response:\n{response}"
    );
    assert!(
        response.contains("Hello from behind the tunnel"),
        "demo page response:\n{response}"
    );

    demo.terminate();
    let code = demo.expect_exit(Duration::from_secs(5)).await;
    assert_eq!(code, 0, "demo exit after SIGTERM\n{}", demo.logs());
}

// ---------------------------------------------------------------------------------------
// Helpers

/// Whether `tool --version` runs.
fn tool_on_path(tool: &str) -> bool {
    std::process::Command::new(tool)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
}

/// The receiver's `bits_per_second` from `iperf3 -J` output (`end.sum_received`), without
/// a JSON parser: the first `"bits_per_second":` after `"sum_received"`.
fn receiver_bits_per_second(json: &str) -> Result<f64, String> {
    if let Some(at) = json.find("\"error\"") {
        let end = json[at..].find('\n').map_or(json.len(), |n| at + n);
        return Err(format!("iperf3 reported {}", &json[at..end]));
    }
    let summary = json
        .find("\"sum_received\"")
        .ok_or("no sum_received in the iperf3 output")?;
    let key = "\"bits_per_second\":";
    let value = json[summary..]
        .find(key)
        .map(|at| summary + at + key.len())
        .ok_or("no bits_per_second in sum_received")?;
    let number: String = json[value..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
        .collect();
    number
        .parse()
        .map_err(|e| format!("bits_per_second {number:?}: {e}"))
}

/// A target that streams random bytes to every visitor until the visitor goes away.
async fn firehose_target() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let chunk = random_bytes(256 * 1024);
        while let Ok((mut stream, _)) = listener.accept().await {
            let chunk = chunk.clone();
            tokio::spawn(async move { while stream.write_all(&chunk).await.is_ok() {} });
        }
    });
    addr
}

/// Reads until the stream ends; `Ok(n)` for a clean EOF after `n` bytes.
async fn drain(visitor: &mut TcpStream) -> std::io::Result<usize> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        match visitor.read(&mut buf).await? {
            0 => return Ok(total),
            n => total += n,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_cut_by_a_killed_server_or_client_is_a_reset() {
    for victim in ["server", "client"] {
        let dir = TestDir::new(&format!("cut-download-{victim}"));
        let mut tunnel = Tunnel::to(firehose_target().await).start(&dir).await;
        let mut visitor = TcpStream::connect(tunnel.service()).await.unwrap();
        let mut first = vec![0u8; 2 * MIB];
        visitor.read_exact(&mut first).await.unwrap();
        match victim {
            "server" => tunnel.server.kill(),
            _ => tunnel.client.kill(),
        }
        let outcome = tokio::time::timeout(Duration::from_secs(10), drain(&mut visitor))
            .await
            .unwrap_or_else(|_| panic!("the cut visitor hung for 10s\n{}", tunnel.logs()));
        match outcome {
            Ok(n) => panic!(
                "killing the {victim} ended an endless download with a clean EOF after {n} more bytes\n{}",
                tunnel.logs()
            ),
            Err(e) => assert_eq!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset,
                "{victim}: {e}"
            ),
        }
    }
}
