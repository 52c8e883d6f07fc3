//! Hostile peers on every port, and resource exhaustion (hardening issue 7, suites 1 and 3).
//!
//! The real `warren` binary with the e2e configs (`handshake_timeout = "5s"`), driven by
//! strangers that send garbage, truncated transcripts, bad length prefixes, dribble bytes,
//! replay a recorded session, use wrong secrets, or connect and say nothing; and by a
//! reconnect storm and runs at low open-file limits. After each, a real client is served,
//! nothing was sent to a stranger before authentication, and the server's descriptors and
//! memory come back near their baseline.
//!
//! Heavy tests scale down in debug builds; `scripts/test.sh` runs this file in release:
//! `cargo test --release -p warren --test hostile -- --nocapture` prints the measurements.

mod e2e_support;
mod harden;

use std::net::SocketAddr;
use std::time::Duration;

use e2e_support::*;
use harden::*;
use rand::RngCore;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use warren::crypto::record::{MAX_PAYLOAD, RecordKind};
use warren::server::pending::{MAX_PENDING_HANDSHAKES, MAX_PENDING_PER_IP};
use warren_proto::message::{self, ControlMessage, Verdict};

/// The `probe` service's own token in [`token_setup`].
const PROBE_TOKEN: &str = "probe-token-0123456789-abcdefgh";

/// `release` in release builds, `debug` in debug builds.
fn scale(release: usize, debug: usize) -> usize {
    if cfg!(debug_assertions) {
        debug
    } else {
        release
    }
}

/// A server alone (no client yet), listening.
struct Lone {
    server: Proc,
    ports: Ports,
}

impl Lone {
    async fn start(dir: &TestDir, config: impl Fn(Ports) -> String, wrapper: &[&str]) -> Lone {
        let ports = Ports::pick();
        let path = dir.write("server.toml", &config(ports));
        let path = path.to_str().expect("utf-8 path");
        let mut args: Vec<&str> = wrapper.to_vec();
        let program = if wrapper.is_empty() {
            WARREN
        } else {
            args.remove(0)
        };
        let mut full: Vec<&str> = args;
        if program != WARREN {
            full.push(WARREN);
        }
        full.extend(["server", path]);
        let mut server = Proc::spawn(dir, "server", program, &full, &[("WARREN_PSK", PSK)]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(loopback(ports.server)).await.is_err() {
            assert!(
                Instant::now() < deadline && server.is_running(),
                "server did not listen\n{}",
                server.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Lone { server, ports }
    }

    fn addr(&self) -> SocketAddr {
        loopback(self.ports.server)
    }

    fn pid(&self) -> u32 {
        self.server.pid()
    }

    /// Starts a real client (web -> `target`, probe -> an echo target).
    async fn client(&self, dir: &TestDir, setup: &Setup, target: SocketAddr) -> Proc {
        let probe = e2e_support::echo_target().await;
        let path = dir.write(
            "client.toml",
            &client_toml(setup, self.ports, target, probe),
        );
        start_client(dir, &path, &setup.client_psk)
    }

    /// Time until the probe service echoes (the real client is up), at most 10 s.
    async fn ready(&self, client: &Proc) -> Duration {
        time_until_echo(loopback(self.ports.probe), Duration::from_secs(10))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "the real client never came up\n{}\n{}",
                    self.server.logs(),
                    client.logs()
                )
            })
    }
}

/// The e2e setup with a separate token for the `probe` service.
fn token_setup(ports: Ports) -> String {
    server_toml(&Setup::default(), ports).replace(
        "[server.services.probe]\n",
        &format!("[server.services.probe]\ntoken = \"{PROBE_TOKEN}\"\n"),
    )
}

fn random(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rand::rng().fill_bytes(&mut bytes);
    bytes
}

/// Sends `bytes` to `addr` (then a FIN if `fin`) and returns what came back before the
/// server closed (or `within` passed) and whether it closed.
async fn probe(addr: SocketAddr, bytes: Vec<u8>, fin: bool, within: Duration) -> (Vec<u8>, bool) {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return (Vec::new(), true);
    };
    if stream.write_all(&bytes).await.is_err() {
        return (Vec::new(), true);
    }
    if fin {
        let _ = stream.shutdown().await;
    }
    drain(&mut stream, within).await
}

// ---------------------------------------------------------------------------------------
// Suite 1: bad input

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_on_the_server_port_get_silence_while_a_real_client_is_served() {
    let dir = TestDir::new("hostile-server-port");
    let lone = Lone::start(&dir, |p| server_toml(&Setup::default(), p), &[]).await;
    let (target, mut served) = hashing_target(64 * 1024).await;
    let client = lone.client(&dir, &Setup::default(), target).await;
    lone.ready(&client).await;
    let addr = lone.addr();

    let (_, message1) = message1(PSK);
    let mut cases: Vec<(String, Vec<u8>, bool)> = Vec::new();
    for len in [1, 2, 3, 4, 16, 64, 100, 1000, 1026, 5000, 70_000] {
        cases.push((format!("garbage {len}"), random(len), true));
    }
    // Length prefixes: 0, MAX+1 (1025) and the largest (65535), with and without a body.
    for prefix in [[0u8, 0], [0x04, 0x01], [0xff, 0xff]] {
        cases.push((format!("prefix {prefix:?}"), prefix.to_vec(), true));
        let mut with_body = prefix.to_vec();
        with_body.extend(random(2000));
        cases.push((format!("prefix {prefix:?} + body"), with_body, true));
    }
    // A genuine message 1 cut at every offset, with a FIN (the server sees EOF) and, for a
    // few offsets, without one (the handshake deadline must end it).
    for cut in 0..message1.len() {
        cases.push((
            format!("message 1 cut at {cut}"),
            message1[..cut].to_vec(),
            true,
        ));
    }
    for cut in [1, 2, 3, message1.len() / 2, message1.len() - 1] {
        cases.push((
            format!("message 1 cut at {cut}, held"),
            message1[..cut].to_vec(),
            false,
        ));
    }
    // Wrong, empty and short PSKs; a data hello for an unknown session; a bad kind.
    for psk in ["the-wrong-psk-0123456789-abcdefgh", "", "short"] {
        cases.push((format!("psk {psk:?}"), self::message1(psk).1, false));
    }
    let mut data_hello = vec![0, 81, b'D'];
    data_hello.extend(random(80));
    cases.push(("data hello, unknown session".into(), data_hello, false));
    let mut bad_kind = message1.clone();
    bad_kind[2] = b'X';
    cases.push(("unknown preamble kind".into(), bad_kind, false));

    // A slowloris dribbling a genuine message 1, one byte per 300 ms (it would need ~20 s).
    let slowloris = tokio::spawn(async move {
        let start = Instant::now();
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        for byte in message1 {
            if stream.write_all(&[byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            if start.elapsed() > Duration::from_secs(12) {
                break;
            }
        }
        let (got, closed) = drain(&mut stream, Duration::from_millis(100)).await;
        (got, closed, start.elapsed())
    });

    let mut tasks = tokio::task::JoinSet::new();
    for (name, bytes, fin) in cases {
        tasks.spawn(async move {
            let started = Instant::now();
            let (got, closed) = probe(addr, bytes, fin, Duration::from_secs(8)).await;
            (name, got, closed, started.elapsed())
        });
    }
    // Meanwhile the real client keeps serving.
    hashed_transfers(
        loopback(lone.ports.web),
        &mut served,
        8,
        256 * 1024,
        64 * 1024,
    )
    .await;
    let mut count = 0;
    while let Some(done) = tasks.join_next().await {
        let (name, got, closed, took) = done.expect("probe task");
        assert!(
            got.is_empty(),
            "{name}: the server answered a stranger: {got:?}"
        );
        assert!(closed, "{name}: not closed within 8 s (took {took:?})");
        count += 1;
    }
    let (got, closed, took) = slowloris.await.expect("slowloris");
    assert!(got.is_empty(), "slowloris got an answer");
    assert!(
        closed && took < Duration::from_secs(8),
        "slowloris not cut by the 5 s handshake deadline (closed {closed}, after {took:?})"
    );
    eprintln!("hostile: {count} stranger probes got silence; slowloris cut after {took:?}");
    hashed_transfers(
        loopback(lone.ports.web),
        &mut served,
        4,
        64 * 1024,
        64 * 1024,
    )
    .await;
    let logs = lone.server.logs();
    assert!(!logs.contains("panicked"), "server panicked\n{logs}");
    drop(client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_handshake_bad_records_replays_and_wrong_tokens_get_no_session() {
    let dir = TestDir::new("hostile-records");
    let lone = Lone::start(&dir, token_setup, &[]).await;
    let addr = lone.addr();
    let five = Duration::from_secs(5);

    // The harness works: the right tokens are accepted.
    let mut good = RawClient::handshake(addr, PSK).await;
    let reply = good
        .hello_exchange(&[("web", TOKEN), ("probe", PROBE_TOKEN)])
        .await;
    assert_eq!(
        reply,
        Some(ControlMessage::HelloReply {
            verdicts: vec![
                Verdict::Accepted { bound: None },
                Verdict::Accepted { bound: None }
            ]
        })
    );

    // Wrong, empty and cross-service tokens: refused, then closed.
    for (name, token) in [
        ("web", "wrong-token-0123456789-abcdefghij"),
        ("web", ""),
        ("web", PROBE_TOKEN),
        ("probe", TOKEN),
        ("unknown", TOKEN),
    ] {
        let mut client = RawClient::handshake(addr, PSK).await;
        let reply = client.hello_exchange(&[(name, token)]).await;
        assert_eq!(
            reply,
            Some(ControlMessage::HelloReply {
                verdicts: vec![Verdict::Refused]
            }),
            "{name} with token {token:?}"
        );
        let (rest, closed) = drain(&mut client.stream, five).await;
        assert!(
            rest.is_empty() && closed,
            "{name}/{token:?}: session not closed"
        );
    }

    // Record headers with lengths 0, max+1, the u24 maximum, and all-ones (2^32-1 with an
    // unknown kind), a hello with a flipped byte, an oversized control message: the server
    // closes without a word.
    let tag = 16;
    let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
    for len in [0usize, MAX_PAYLOAD + tag + 1, 0xff_ffff] {
        let mut header = vec![2u8];
        header.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
        header.extend(random(64));
        headers.push((format!("record length {len}"), header));
    }
    headers.push(("record header 0xffffffff".into(), vec![0xff; 4]));
    let mut flipped_client = RawClient::handshake(addr, PSK).await;
    let mut hello = flipped_client.hello(&[("web", TOKEN)]);
    let last = hello.len() - 1;
    hello[last] ^= 0x01;
    flipped_client.send_raw(&hello).await.expect("send");
    let (got, closed) = drain(&mut flipped_client.stream, five).await;
    assert!(got.is_empty() && closed, "a flipped hello was answered");
    for (name, bytes) in headers {
        let mut client = RawClient::handshake(addr, PSK).await;
        client.send_raw(&bytes).await.expect("send");
        let (got, closed) = drain(&mut client.stream, five).await;
        assert!(got.is_empty() && closed, "{name}: answered or kept open");
    }
    // A genuine hello record cut at every offset (then a FIN): no reply, closed.
    let mut cuts = tokio::task::JoinSet::new();
    let hello_len = RawClient::handshake(addr, PSK)
        .await
        .hello(&[("web", TOKEN)])
        .len();
    for cut in 0..hello_len {
        cuts.spawn(async move {
            let mut client = RawClient::handshake(addr, PSK).await;
            let hello = client.hello(&[("web", TOKEN)]);
            client.send_raw(&hello[..cut]).await.expect("send");
            client.stream.shutdown().await.expect("fin");
            let (got, closed) = drain(&mut client.stream, Duration::from_secs(5)).await;
            assert!(
                got.is_empty() && closed,
                "hello cut at {cut}: answered or kept open"
            );
        });
    }
    while let Some(done) = cuts.join_next().await {
        done.expect("truncated hello");
    }
    // An authentic but oversized hello comes from a peer that proved the PSK: it is told
    // why (a v1 peer reads a goodbye) before the server closes.
    let mut big = RawClient::handshake(addr, PSK).await;
    let oversized = big.seal(RecordKind::Control, &random(20 * 1024));
    big.send_raw(&oversized).await.expect("send");
    let told = big
        .recv(five)
        .await
        .map(|(_, body)| message::decode_control(&body));
    match told {
        Some(Ok(ControlMessage::Goodbye { reason })) => assert!(
            reason.contains("exceeds the limit") && reason.contains("upgrade"),
            "{reason}"
        ),
        other => panic!("an oversized hello got {other:?}, not a reason"),
    }
    let (rest, closed) = drain(&mut big.stream, five).await;
    assert!(
        rest.is_empty() && closed,
        "oversized hello: session kept open"
    );

    // A replay of a whole recorded session (message 1, hello): the server cannot tell the
    // replayed message 1 from a new one and answers it with message 2, which the replayer
    // cannot use; the replayed hello does not open under the new keys, so no HelloReply.
    let recorded = good.sent.clone();
    let (got, closed) = probe(addr, recorded, false, five).await;
    assert!(closed, "replay not closed");
    assert!(got.len() >= 2, "no message 2 for the replayed message 1");
    let frame = 2 + usize::from(u16::from_be_bytes([got[0], got[1]]));
    assert_eq!(got.len(), frame, "the replayer got more than message 2");

    // The real service still works afterwards.
    let (target, mut served) = hashing_target(1000).await;
    let setup = Setup::default();
    let probe_path = dir.write(
        "client.toml",
        &client_toml(&setup, lone.ports, target, echo_target().await).replace(
            "[client.services.probe]\n",
            &format!("[client.services.probe]\ntoken = \"{PROBE_TOKEN}\"\n"),
        ),
    );
    drop(good);
    let client = start_client(&dir, &probe_path, PSK);
    lone.ready(&client).await;
    hashed_transfers(loopback(lone.ports.web), &mut served, 2, 1000, 1000).await;
}

// ---------------------------------------------------------------------------------------
// Suites 1 and 3: silent peers, reconnect storms, low descriptor limits

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peers_do_not_delay_a_real_client_and_resources_come_back() {
    let limit = raise_fd_limit(20_000);
    // Two descriptors per peer live in this process only until the server drops its end;
    // our ends stay open, so stay well under the limit.
    let peers = scale(9_000, 2_000).min((limit as usize).saturating_sub(500));
    let dir = TestDir::new("hostile-silent");
    let lone = Lone::start(&dir, |p| server_toml(&Setup::default(), p), &[]).await;
    let pid = lone.pid();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (fds0, rss0) = (fd_count(pid), rss_kib(pid));

    // Visitors on a service port with no client: reset at once, nothing sent.
    for _ in 0..20 {
        let (got, closed) = probe(
            loopback(lone.ports.web),
            random(100),
            false,
            Duration::from_secs(2),
        )
        .await;
        assert!(
            got.is_empty() && closed,
            "a visitor without a client got bytes or hung"
        );
    }

    // 45 source addresses, at most 200 peers each (under the per-address cap of
    // MAX_PENDING_PER_IP), so the global cap is what acts.
    let flood_start = Instant::now();
    let mut silent = silent_peers(lone.addr(), peers, 45).await;
    let flood_took = flood_start.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (fds_flood, rss_flood) = (fd_count(pid), rss_kib(pid));
    assert!(
        fds_flood <= fds0 + MAX_PENDING_HANDSHAKES + 64,
        "pending connections not capped: {fds_flood} fds (baseline {fds0})"
    );
    assert!(
        rss_flood < rss0 + 200 * 1024,
        "memory not bounded: {rss_flood} KiB (baseline {rss0})"
    );

    // A real client starts now and must be up within a second, beside the silent crowd.
    let (target, mut served) = hashing_target(1000).await;
    let client_start = Instant::now();
    let mut client = lone.client(&dir, &Setup::default(), target).await;
    let up = lone.ready(&client).await;
    let up_total = client_start.elapsed();
    hashed_transfers(loopback(lone.ports.web), &mut served, 4, 10_000, 1000).await;
    assert!(
        up_total < Duration::from_secs(1),
        "the real client needed {up_total:?} to come up beside {peers} silent peers"
    );

    // No silent peer got a byte; the oldest were closed to make room.
    let mut closed = 0;
    for stream in &silent {
        let mut buf = [0u8; 64];
        match stream.try_read(&mut buf) {
            Ok(0) => closed += 1,
            Ok(n) => panic!("a silent peer received {n} bytes"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => closed += 1,
        }
    }
    let open = silent.len() - closed;
    assert!(
        open <= MAX_PENDING_HANDSHAKES + 64,
        "{open} silent peers still held"
    );

    silent.clear();
    client.kill();
    let fds_after = wait_fds_at_most(pid, fds0 + 2, Duration::from_secs(10)).await;
    let rss_after = rss_kib(pid);
    eprintln!(
        "hostile: {peers} silent peers from 45 addresses connected in {flood_took:?}; \
         server fds {fds0} -> {fds_flood} (flood) -> {fds_after} (after), \
         VmRSS {rss0} -> {rss_flood} -> {rss_after} KiB; {closed} peers evicted (oldest first); \
         real client up in {up_total:?} (probe echo {up:?} after start)"
    );
    assert!(
        fds_after <= fds0 + 2,
        "descriptors leaked: {fds_after} (baseline {fds0})"
    );
    assert!(
        rss_after < rss0 + 64 * 1024,
        "memory did not come back: {rss_after} KiB (baseline {rss0})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_flooding_evicts_its_own_connections_not_others() {
    let dir = TestDir::new("hostile-per-ip");
    let lone = Lone::start(&dir, |p| server_toml(&Setup::default(), p), &[]).await;
    // A stranger at 127.0.0.2 holds MAX_PENDING_PER_IP silent connections, then more.
    let first = silent_peers(lone.addr(), MAX_PENDING_PER_IP, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _second = silent_peers(lone.addr(), 50, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut evicted = 0;
    for stream in &first {
        let mut buf = [0u8; 8];
        match stream.try_read(&mut buf) {
            Ok(0) => evicted += 1,
            Ok(n) => panic!("a silent peer received {n} bytes"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => evicted += 1,
        }
    }
    assert_eq!(
        evicted, 50,
        "the address's 50 oldest should have been closed"
    );
    // Its newest survive, and a real client from 127.0.0.1 is unaffected.
    let (target, _served) = hashing_target(10).await;
    let client = lone.client(&dir, &Setup::default(), target).await;
    let up = lone.ready(&client).await;
    assert!(up < Duration::from_secs(2), "real client took {up:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_storm_leaves_no_sessions_descriptors_or_memory_behind() {
    let dir = TestDir::new("hostile-storm");
    let lone = Lone::start(&dir, |p| server_toml(&Setup::default(), p), &[]).await;
    let pid = lone.pid();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (fds0, rss0) = (fd_count(pid), rss_kib(pid));
    let sessions = 200;
    let addr = lone.addr();
    for batch in 0..sessions / 20 {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..20 {
            tasks.spawn(async move {
                let mut client = RawClient::handshake(addr, PSK).await;
                let reply = client.hello_exchange(&[("web", TOKEN)]).await;
                assert!(
                    matches!(reply, Some(ControlMessage::HelloReply { .. })),
                    "storm session refused: {reply:?}"
                );
                drop(client);
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap_or_else(|e| panic!("storm batch {batch}: {e}"));
        }
    }
    let fds_after = wait_fds_at_most(pid, fds0 + 2, Duration::from_secs(10)).await;
    let rss_after = rss_kib(pid);
    let (target, mut served) = hashing_target(1000).await;
    let client = lone.client(&dir, &Setup::default(), target).await;
    let up = lone.ready(&client).await;
    hashed_transfers(loopback(lone.ports.web), &mut served, 4, 10_000, 1000).await;
    eprintln!(
        "hostile: {sessions} sessions opened and dropped: server fds {fds0} -> {fds_after}, \
         VmRSS {rss0} -> {rss_after} KiB; real client up {up:?} after"
    );
    assert!(
        fds_after <= fds0 + 2,
        "descriptors leaked: {fds_after} (baseline {fds0})"
    );
    assert!(
        rss_after < rss0 + 32 * 1024,
        "memory grew: {rss_after} KiB (baseline {rss0})"
    );
}

/// `pid`'s descriptor count once two reads 200 ms apart agree (at most ~3 s).
async fn settled_fd_count(pid: u32) -> usize {
    let mut last = fd_count(pid);
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = fd_count(pid);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// The server under `prlimit --nofile=LIMIT:LIMIT`: more connections than descriptors make
/// `accept()` fail with EMFILE; the listener must back off and go on, and serve a real
/// client once the crowd leaves.
async fn accept_survives_emfile(limit: u64) {
    if !tool_on_path("prlimit") {
        eprintln!("SKIPPED accept_survives_emfile({limit}): prlimit not on PATH (util-linux)");
        return;
    }
    raise_fd_limit(20_000);
    let dir = TestDir::new(&format!("hostile-emfile-{limit}"));
    let nofile = format!("--nofile={limit}:{limit}");
    let mut lone = Lone::start(
        &dir,
        |p| server_toml(&Setup::default(), p),
        &["prlimit", &nofile],
    )
    .await;
    let pid = lone.pid();
    // The server may still be opening descriptors of its own just after it listens (seen:
    // a baseline of 12 against a steady 17, read as a "leak"): wait for the count to settle.
    let fds0 = settled_fd_count(pid).await;
    // Spread over addresses so the per-address cap does not free descriptors first.
    let crowd = silent_peers(lone.addr(), limit as usize + 60, 40).await;
    let saw_emfile = lone
        .server
        .stderr_contains_within("accept_failed", Duration::from_secs(5))
        .await;
    assert!(
        saw_emfile,
        "the crowd never exhausted descriptors\n{}",
        lone.server.logs()
    );
    assert!(lone.server.is_running(), "the server died at EMFILE");
    drop(crowd);
    let fds_after = wait_fds_at_most(pid, fds0 + 2, Duration::from_secs(10)).await;
    let (target, mut served) = hashing_target(1000).await;
    let client = lone.client(&dir, &Setup::default(), target).await;
    let up = lone.ready(&client).await;
    hashed_transfers(loopback(lone.ports.web), &mut served, 4, 10_000, 1000).await;
    eprintln!(
        "hostile: at nofile={limit}: accept() hit EMFILE and recovered; fds {fds0} -> {fds_after}; \
         real client up {up:?} after the crowd left"
    );
    assert!(
        fds_after <= fds0 + 2,
        "descriptors leaked: {fds_after} (baseline {fds0})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_survives_emfile_at_nofile_64() {
    accept_survives_emfile(64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_survives_emfile_at_nofile_1024() {
    accept_survives_emfile(1024).await;
}

fn tool_on_path(tool: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
