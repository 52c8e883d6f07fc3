//! End-to-end tests of the operations commands (issue 6) with the real binary: `warren
//! doctor` on a healthy setup and on each kind of breakage, `warren ping`, shell
//! completions, `--help` examples, and logs that never contain a secret.
//!
//! Run: `cargo test --release -p warren --test e2e_ops`.

mod e2e_support;

use std::time::Duration;

use e2e_support::*;

async fn doctor(dir: &TestDir, config: &std::path::Path, psk: &str) -> (i32, String, String) {
    Proc::warren_output(
        dir,
        "doctor",
        &["doctor", config.to_str().unwrap()],
        &[("WARREN_PSK", psk)],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_passes_on_a_healthy_setup() {
    let dir = TestDir::new("doctor-healthy");
    let tunnel = Tunnel::to(echo_target().await).start(&dir).await;
    let (code, out, err) = doctor(&dir, &tunnel.client_config, PSK).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("[OK]   handshake"), "{out}");
    assert!(out.contains("cipher "), "{out}");
    assert!(out.contains("[OK]   service web: accepted"), "{out}");
    assert!(out.contains("[OK]   target web"), "{out}");
    assert!(out.contains("[OK]   aead speed"), "{out}");
    assert!(out.contains("GB/s"), "{out}");
    // Issue 20: the choice with both sides' figures, and the CPU features behind them.
    assert!(out.contains("[OK]   cipher choice"), "{out}");
    assert!(out.contains("chosen by fastest; client "), "{out}");
    assert!(out.contains("[OK]   cpu features"), "{out}");
    assert!(!out.contains(PSK) && !out.contains(TOKEN), "{out}");

    let (code, out, _) = Proc::warren_output(
        &dir,
        "doctor-json",
        &[
            "doctor",
            tunnel.client_config.to_str().unwrap(),
            "--format",
            "json",
        ],
        &[("WARREN_PSK", PSK)],
    )
    .await;
    assert_eq!(code, 0);
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON report");
    assert_eq!(report["ok"], true);
    assert_eq!(report["side"], "client");
    assert!(report["checks"].as_array().unwrap().len() > 5);
}

/// Issue 19: with `transports = [...]`, doctor tries each one and says which the client
/// will use (the first that works).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_tries_every_transport_and_names_the_one_the_client_will_use() {
    let dir = TestDir::new("doctor-transports");
    let ports = Ports::pick();
    let server_config = dir.write(
        "server.toml",
        &server_toml(&Setup::default(), ports)
            .replace(
                "transport = \"noise\"",
                "transports = [\"quic\", \"noise\"]",
            )
            .replace(
                "\n[server.services.web]",
                &format!(
                    "\n[server.quic]\ncert = \"{}\"\n\n[server.services.web]",
                    dir.path().join("quic.pem").display()
                ),
            ),
    );
    let mut server = start_server(&dir, &server_config);
    wait_listening(ports.server, "the server").await;
    let closed = free_port();
    let (target, probe) = (echo_target().await, echo_target().await);
    let client_config = dir.write(
        "client.toml",
        &client_toml(&Setup::default(), ports, target, probe).replace(
            "transport = \"noise\"",
            &format!("transports = [\"tls:{closed}\", \"quic\", \"noise\"]"),
        ),
    );
    let (code, out, err) = doctor(&dir, &client_config, PSK).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(&format!(
            "[WARN] transport tls  : 127.0.0.1:{closed}: fails"
        )),
        "{out}"
    );
    assert!(out.contains("[OK]   transport quic : "), "{out}");
    assert!(out.contains("[OK]   transport noise: "), "{out}");
    assert!(
        out.contains("[OK]   transport: the client will use quic"),
        "{out}"
    );
    assert!(out.contains("cipher tls1.3-quic"), "{out}");
    server.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_a_wrong_psk() {
    let dir = TestDir::new("doctor-psk");
    let tunnel = Tunnel::to(echo_target().await).start(&dir).await;
    let (code, out, err) =
        doctor(&dir, &tunnel.client_config, "another-psk-0123456789-abcdef").await;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("[FAIL] handshake"), "{out}");
    assert!(out.contains("PSK"), "{out}");
    assert!(out.contains("fix: wrong PSK"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_a_stopped_server() {
    let dir = TestDir::new("doctor-stopped");
    let ports = Ports::pick();
    let config = dir.write(
        "client.toml",
        &client_toml(
            &Setup::default(),
            ports,
            echo_target().await,
            echo_target().await,
        ),
    );
    let (code, out, _) = doctor(&dir, &config, PSK).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("[FAIL] handshake"), "{out}");
    assert!(out.contains("cannot connect"), "{out}");
    assert!(out.contains("is the server running"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_a_taken_port() {
    let dir = TestDir::new("doctor-port");
    let ports = Ports::pick();
    let _holder = std::net::TcpListener::bind(loopback(ports.web)).unwrap();
    let config = dir.write("server.toml", &server_toml(&Setup::default(), ports));
    let (code, out, _) = doctor(&dir, &config, PSK).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("[FAIL] service web port"), "{out}");
    assert!(out.contains("port is taken"), "{out}");
    assert!(out.contains("[OK]   server port"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_a_dead_target() {
    let dir = TestDir::new("doctor-target");
    let tunnel = Tunnel::to(echo_target().await).start(&dir).await;
    let dead = loopback(free_port());
    let config = dir.write(
        "dead.toml",
        &client_toml(&Setup::default(), tunnel.ports, dead, echo_target().await),
    );
    let (code, out, _) = doctor(&dir, &config, PSK).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("[FAIL] target web"), "{out}");
    assert!(out.contains(&format!("{dead} is unreachable")), "{out}");
    assert!(out.contains("[OK]   handshake"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reports_a_bad_config() {
    let dir = TestDir::new("doctor-config");
    let config = dir.write("bad.toml", "[client]\nserver = \"nope\"\n");
    let (code, out, _) = doctor(&dir, &config, PSK).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("[FAIL] config"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_reports_statistics() {
    let dir = TestDir::new("ping");
    let tunnel = Tunnel::to(echo_target().await).start(&dir).await;
    let (code, out, err) = Proc::warren_output(
        &dir,
        "ping",
        &[
            "ping",
            tunnel.client_config.to_str().unwrap(),
            "-n",
            "3",
            "--interval-ms",
            "10",
        ],
        &[("WARREN_PSK", PSK)],
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    for needle in ["probe 1:", "probe 3:", "3 ok, 0 failed", "rtt", "median"] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    let remote = format!("127.0.0.1:{}", tunnel.ports.server);
    let (code, out, _) = Proc::warren_output(
        &dir,
        "ping-r",
        &["ping", "-r", &remote, "-n", "2", "--interval-ms", "10"],
        &[("WARREN_PSK", PSK)],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2 ok, 0 failed"), "{out}");
    let (code, out, _) = Proc::warren_output(
        &dir,
        "ping-bad",
        &["ping", "-r", &remote, "-n", "1"],
        &[("WARREN_PSK", "another-psk-0123456789-abcdef")],
    )
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("PSKs probably differ"), "{out}");
    // The server kept serving its real client throughout.
    let reply = round_trip(tunnel.service(), b"still here").await.unwrap();
    assert_eq!(reply, b"still here");
}

#[tokio::test]
async fn completions_for_every_shell() {
    let dir = TestDir::new("completions");
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = Proc::warren_output(&dir, shell, &["completions", shell], &[]).await;
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("warren") && out.contains("doctor"), "{shell}");
    }
}

#[tokio::test]
async fn every_subcommand_help_has_an_example() {
    let dir = TestDir::new("help");
    for sub in [
        "server",
        "client",
        "keygen",
        "check",
        "doctor",
        "ping",
        "completions",
        "demo",
    ] {
        let (code, out, _) = Proc::warren_output(&dir, sub, &[sub, "--help"], &[]).await;
        assert_eq!(code, 0, "{sub}");
        assert!(
            out.contains("Example"),
            "`warren {sub} --help` has no example:\n{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_logs_never_contain_secrets() {
    let dir = TestDir::new("log-secrets");
    let ports = Ports::pick();
    let target = echo_target().await;
    let server_config = dir.write("server.toml", &server_toml(&Setup::default(), ports));
    let client_config = dir.write(
        "client.toml",
        &client_toml(&Setup::default(), ports, target, echo_target().await),
    );
    let mut server = Proc::warren(
        &dir,
        "server",
        &["server", server_config.to_str().unwrap()],
        &[("WARREN_PSK", PSK), ("WARREN_LOG", "trace")],
    );
    let mut client = Proc::warren(
        &dir,
        "client",
        &[
            "--log-format",
            "json",
            "client",
            client_config.to_str().unwrap(),
        ],
        &[("WARREN_PSK", PSK), ("WARREN_LOG", "trace")],
    );
    let service = loopback(ports.web);
    let mut worked = false;
    for _ in 0..100 {
        if round_trip(service, b"hello").await.ok().as_deref() == Some(b"hello".as_slice()) {
            worked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(worked, "{}\n{}", server.logs(), client.logs());
    server.terminate();
    client.terminate();
    server.wait_exit(Duration::from_secs(5)).await;
    client.wait_exit(Duration::from_secs(5)).await;
    let logs = format!("{}\n{}", server.logs(), client.logs());
    assert!(logs.contains("session_started"), "{logs}");
    assert!(!logs.contains(PSK), "the PSK leaked into the logs");
    assert!(!logs.contains(TOKEN), "a token leaked into the logs");
}

/// Sends SIGHUP to a process this test started.
fn hangup(process: &Proc) {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &process.pid().to_string()])
        .status()
        .expect("run kill -HUP");
    assert!(status.success(), "kill -HUP {} failed", process.pid());
}

/// Writes `text` aside and renames it over `path`, as editors and config management do.
fn replace_file(path: &std::path::Path, text: &str) {
    let aside = path.with_extension("toml.new");
    std::fs::write(&aside, text).expect("write config");
    std::fs::rename(&aside, path).expect("rename config");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_adds_a_service_while_a_transfer_keeps_flowing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = TestDir::new("reload");
    let echo = echo_target().await;
    let mut tunnel = Tunnel::to(echo).start(&dir).await;
    // A long echo transfer through `web`, which no reload below touches.
    let mut transfer = tokio::net::TcpStream::connect(tunnel.service())
        .await
        .unwrap();
    let (mut sent, mut received) = (blake3::Hasher::new(), blake3::Hasher::new());
    let mut exchange = async |stream: &mut tokio::net::TcpStream| {
        let chunk = random_bytes(512 * 1024);
        sent.update(&chunk);
        let mut back = vec![0u8; chunk.len()];
        let (mut r, mut w) = stream.split();
        let (wrote, read) = tokio::join!(w.write_all(&chunk), r.read_exact(&mut back));
        wrote.expect("the transfer keeps taking bytes");
        read.expect("the transfer keeps echoing");
        received.update(&back);
    };
    exchange(&mut transfer).await;

    // The server: a new service, applied on SIGHUP.
    let extra = free_port();
    let server_text = server_toml(&tunnel.setup, tunnel.ports)
        + &format!("\n[server.services.extra]\nbind = \"127.0.0.1:{extra}\"\n");
    replace_file(&tunnel.server_config, &server_text);
    hangup(&tunnel.server);
    assert!(
        tunnel
            .server
            .stderr_contains_within("added service extra", Duration::from_secs(10))
            .await,
        "{}",
        tunnel.logs()
    );
    exchange(&mut transfer).await;

    // The client: the same service, picked up from the file change alone.
    let client_text = client_toml(&tunnel.setup, tunnel.ports, echo, echo_target().await)
        + &format!("\n[client.services.extra]\ntarget = \"{echo}\"\n");
    replace_file(&tunnel.client_config, &client_text);
    assert!(
        tunnel
            .client
            .stderr_contains_within("config_reloaded", Duration::from_secs(10))
            .await,
        "{}",
        tunnel.logs()
    );
    let payload = random_bytes(64 * 1024);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match round_trip(loopback(extra), &payload).await {
            Ok(reply) if reply == payload => break,
            _ if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("extra never served: {other:?}\n{}", tunnel.logs()),
        }
    }
    exchange(&mut transfer).await;

    // A broken file is refused with its line; everything keeps running.
    replace_file(&tunnel.server_config, "[server]\nbind = 7000\n");
    hangup(&tunnel.server);
    assert!(
        tunnel
            .server
            .stderr_contains_within("reload_rejected", Duration::from_secs(10))
            .await,
        "{}",
        tunnel.logs()
    );
    assert!(tunnel.server.stderr().contains("2:"), "{}", tunnel.logs());
    assert!(tunnel.server.is_running());
    exchange(&mut transfer).await;
    assert_eq!(
        round_trip(loopback(extra), &payload).await.unwrap(),
        payload
    );

    transfer.shutdown().await.unwrap();
    let mut rest = Vec::new();
    transfer.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    assert_eq!(
        sent.finalize(),
        received.finalize(),
        "every byte came back intact"
    );
    let logs = tunnel.logs();
    assert!(
        !logs.contains(PSK) && !logs.contains(TOKEN),
        "no secret in the logs"
    );
}

/// SIGTERM drains a server (issue 43): doctor says so while it does, `--drain-timeout`
/// bounds the wait for a stream that never ends, and a second SIGTERM stops it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_server_shows_in_doctor_and_its_drain_is_bounded() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = TestDir::new("drain-flags");
    let mut tunnel = Tunnel::to(echo_target().await).start(&dir).await;
    let config = tunnel.server_config.to_str().unwrap().to_owned();
    for (timeout, second_term) in [("1s", false), ("60s", true)] {
        tunnel.server.kill();
        tunnel.server = Proc::warren(
            &dir,
            "server",
            &["server", &config, "--drain-timeout", timeout],
            &[("WARREN_PSK", PSK)],
        );
        tunnel.wait_ready().await;
        // A visitor that stays open: the drain waits for it.
        let mut visitor = tokio::net::TcpStream::connect(tunnel.service())
            .await
            .unwrap();
        visitor.write_all(b"still here").await.unwrap();
        let mut echo = [0u8; 10];
        visitor.read_exact(&mut echo).await.unwrap();
        let asked = tokio::time::Instant::now();
        tunnel.server.terminate();
        // While it drains, doctor names the state.
        let (code, out, err) = doctor(&dir, &tunnel.client_config, PSK).await;
        assert_eq!(code, 1, "{out}\n{err}");
        assert!(
            out.contains("the server is draining for a restart"),
            "{out}"
        );
        if second_term {
            tunnel.server.terminate();
        }
        let status = tunnel.server.wait_exit(Duration::from_secs(20)).await;
        let took = asked.elapsed();
        let logs = tunnel.server.logs();
        assert!(status.is_some_and(|s| s.success()), "{status:?}\n{logs}");
        if second_term {
            assert!(
                took < Duration::from_secs(20) && !logs.contains("drain_timeout"),
                "a second SIGTERM did not stop the draining server at once ({took:?})\n{logs}"
            );
        } else {
            assert!(
                logs.contains("event=\"drain_timeout\"") && logs.contains("open_streams=1"),
                "--drain-timeout 1s did not end the drain\n{logs}"
            );
            assert!(took >= Duration::from_secs(1), "{took:?}\n{logs}");
        }
        // The cut visitor ends (reset or closed), it does not hang.
        let mut rest = Vec::new();
        let ended =
            tokio::time::timeout(Duration::from_secs(10), visitor.read_to_end(&mut rest)).await;
        assert!(ended.is_ok(), "the cut visitor hung\n{logs}");
    }
    tunnel.client.kill();
}
