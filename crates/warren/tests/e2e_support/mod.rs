//! End-to-end support: the real `warren` binary as child processes, configs written into a
//! fresh temp dir per test, free loopback ports, in-process target services and payload
//! checks by hash.
//!
//! Main types:
//! - [`TestDir`]: a fresh directory per test, removed when the test passes and kept (with
//!   its path printed) when it fails.
//! - [`Proc`]: one child process with stdout and stderr captured to files. Dropping it kills
//!   the child; when the test is failing it also prints the captured output.
//! - [`Tunnel`]: a `warren server` and a `warren client` around one target, built with
//!   [`TunnelBuilder`], with a second `probe` echo service used to tell when the tunnel works.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use rand::RngCore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The binary under test (the release binary under `cargo test --release`).
pub const WARREN: &str = env!("CARGO_BIN_EXE_warren");
/// The PSK every tunnel uses, passed as `WARREN_PSK`.
pub const PSK: &str = "e2e-psk-0123456789-abcdefghijkl";
/// The token every tunnel uses unless a test changes it.
pub const TOKEN: &str = "e2e-token-0123456789-abcdefghij";
/// How long a tunnel may take to come up (or to come back).
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// Temp dir, ports, bytes

/// A fresh directory for one test's configs and logs.
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    /// Creates `$TMPDIR/warren-e2e-NAME-PID-RANDOM`.
    pub fn new(name: &str) -> TestDir {
        let path = std::env::temp_dir().join(format!(
            "warren-e2e-{name}-{}-{:016x}",
            std::process::id(),
            rand::rng().next_u64()
        ));
        std::fs::create_dir_all(&path).expect("create the test dir");
        TestDir { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents` to `name` in the directory and returns the full path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.path.join(name);
        std::fs::write(&path, contents).expect("write a file in the test dir");
        path
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Keep the configs and logs to read, not the payloads: a failed transfer test
            // would otherwise leave gigabytes behind on every run until the disk is full.
            let dropped = remove_large_files(&self.path, 1 << 20);
            eprintln!(
                "test files kept in {} ({dropped} payload files over 1 MiB removed)",
                self.path.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Removes every file larger than `limit` bytes under `dir`; returns how many.
fn remove_large_files(dir: &Path, limit: u64) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            removed += remove_large_files(&entry.path(), limit);
        } else if meta.len() > limit && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[path = "../support/ports.rs"]
mod ports;
pub use ports::free_port;
#[path = "../support/temp.rs"]
mod temp;
pub use temp::reused_temp_dir;

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Random bytes.
pub fn random_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rand::rng().fill_bytes(&mut bytes);
    bytes
}

/// Removes ANSI escape sequences (`ESC [ ... letter`), so log checks do not depend on colour.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Child processes

/// A child process with stdout and stderr captured to files in the test dir.
///
/// Drop kills the child (SIGKILL) if it still runs, and prints its output if the test is
/// failing.
pub struct Proc {
    name: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    status: Option<ExitStatus>,
}

impl Proc {
    /// Starts `program args..` in `dir` with `envs` (and `NO_COLOR=1`; `WARREN_PSK` and
    /// `WARREN_LOG` are only set when given).
    ///
    /// Output goes to `NAME.N.stdout` / `NAME.N.stderr`, `N` counting restarts.
    pub fn spawn(
        dir: &TestDir,
        name: &str,
        program: &str,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Proc {
        Proc::spawn_with(dir, name, program, args, envs, |_| {})
    }

    /// [`Proc::spawn`] with `adjust` applied to the command first (a group id, say).
    pub fn spawn_with(
        dir: &TestDir,
        name: &str,
        program: &str,
        args: &[&str],
        envs: &[(&str, &str)],
        adjust: impl FnOnce(&mut Command),
    ) -> Proc {
        let (stdout, stderr) = (1..)
            .map(|n| {
                (
                    dir.path().join(format!("{name}.{n}.stdout")),
                    dir.path().join(format!("{name}.{n}.stderr")),
                )
            })
            .find(|(out, _)| !out.exists())
            .expect("an unused log name");
        let mut command = Command::new(program);
        command
            .args(args)
            .current_dir(dir.path())
            .env_remove("WARREN_PSK")
            .env_remove("WARREN_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("create stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("create stderr file"));
        for (key, value) in envs {
            command.env(key, value);
        }
        adjust(&mut command);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program} {args:?}: {e}"));
        Proc {
            name: format!("{name} ({program} {})", args.join(" ")),
            child,
            stdout,
            stderr,
            status: None,
        }
    }

    /// Starts the `warren` binary with `args` and `envs`.
    pub fn warren(dir: &TestDir, name: &str, args: &[&str], envs: &[(&str, &str)]) -> Proc {
        Proc::spawn(dir, name, WARREN, args, envs)
    }

    /// Runs `warren args..` to the end (at most 10 s) and returns (exit code, stdout, stderr).
    pub async fn warren_output(
        dir: &TestDir,
        name: &str,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> (i32, String, String) {
        let mut proc = Proc::warren(dir, name, args, envs);
        let code = proc.expect_exit(Duration::from_secs(10)).await;
        (code, proc.stdout(), proc.stderr())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the child wrote to stdout so far.
    pub fn stdout(&self) -> String {
        strip_ansi(&std::fs::read_to_string(&self.stdout).unwrap_or_default())
    }

    /// Everything the child wrote to stderr so far (the logs), without colour codes.
    pub fn stderr(&self) -> String {
        strip_ansi(&std::fs::read_to_string(&self.stderr).unwrap_or_default())
    }

    /// The exit status if the child has exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status
    }

    /// Whether the child still runs.
    pub fn is_running(&mut self) -> bool {
        self.try_status().is_none()
    }

    /// Waits up to `timeout` for the child to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        // Bounded: at most timeout / 20ms polls.
        loop {
            if let Some(status) = self.try_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits up to `timeout` for the child to exit and returns its exit code; panics (with
    /// the logs) if it does not exit or dies from a signal.
    pub async fn expect_exit(&mut self, timeout: Duration) -> i32 {
        let status = self.wait_exit(timeout).await.unwrap_or_else(|| {
            panic!(
                "{} did not exit within {timeout:?}\nstderr:\n{}",
                self.name,
                self.stderr()
            )
        });
        status.code().unwrap_or_else(|| {
            panic!(
                "{} ended by a signal: {status}\nstderr:\n{}",
                self.name,
                self.stderr()
            )
        })
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
    }

    /// Sends SIGTERM (through `kill -TERM PID`: the crate has no signal bindings).
    pub fn terminate(&mut self) {
        self.signal("TERM");
    }

    /// Sends the signal `name` (`"STOP"`, `"CONT"`, ...) through `kill -NAME PID`.
    pub fn signal(&mut self, name: &str) {
        assert!(self.is_running(), "{} exited before SIG{name}", self.name);
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap_or_else(|e| panic!("run kill -{name}: {e}"));
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// Polls stdout until it contains `needle`, for at most `timeout`.
    pub async fn wait_stdout(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.stdout();
            if out.contains(needle) {
                return out;
            }
            if Instant::now() >= deadline || !self.is_running() {
                panic!(
                    "{} did not print {needle:?} within {timeout:?}\nstdout:\n{out}\nstderr:\n{}",
                    self.name,
                    self.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls stderr until it contains `needle`, for at most `timeout`; returns whether it did.
    pub async fn stderr_contains_within(&mut self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.stderr().contains(needle) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// This child's captured output, for failure messages.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        let _ = write!(
            text,
            "----- {} stdout -----\n{}----- {} stderr -----\n{}",
            self.name,
            self.stdout(),
            self.name,
            self.stderr()
        );
        text
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

// ---------------------------------------------------------------------------------------
// Configs

/// What differs between the tunnels of the tests (mirrors `tests/support::Setup`).
#[derive(Clone)]
pub struct Setup {
    /// `transport = ..` on both sides.
    pub transport: &'static str,
    /// `insecure = ..` on both sides.
    pub insecure: bool,
    /// `ciphers = [..]` in the client config; `None` leaves the default.
    pub client_ciphers: Option<Vec<&'static str>>,
    /// The server's `default_token`.
    pub server_token: String,
    /// The client's `default_token`.
    pub client_token: String,
    /// The client's `WARREN_PSK`.
    pub client_psk: String,
    /// More lines for the client's `[client.services.web]`.
    pub client_web: String,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            transport: "noise",
            insecure: false,
            client_ciphers: None,
            server_token: TOKEN.into(),
            client_token: TOKEN.into(),
            client_psk: PSK.into(),
            client_web: String::new(),
        }
    }
}

/// The ports of one tunnel (all on 127.0.0.1).
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    /// The server port (clients connect here).
    pub server: u16,
    /// The `web` service port (visitors of the test's target connect here).
    pub web: u16,
    /// The `probe` service port (an echo service, used to tell when the tunnel works).
    pub probe: u16,
}

impl Ports {
    /// Three distinct free ports (see [`free_port`]).
    pub fn pick() -> Ports {
        let mut picked: Vec<u16> = Vec::with_capacity(3);
        while picked.len() < 3 {
            let port = free_port();
            if !picked.contains(&port) {
                picked.push(port);
            }
        }
        Ports {
            server: picked[0],
            web: picked[1],
            probe: picked[2],
        }
    }
}

/// A server config with the `web` and `probe` services.
pub fn server_toml(setup: &Setup, ports: Ports) -> String {
    format!(
        r#"# e2e server
[server]
bind = "127.0.0.1:{server}"
psk = "${{WARREN_PSK}}"
default_token = "{token}"
transport = "{transport}"
insecure = {insecure}
heartbeat_interval = "1s"
handshake_timeout = "5s"

[server.services.web]
bind = "127.0.0.1:{web}"

[server.services.probe]
bind = "127.0.0.1:{probe}"
{quic}"#,
        server = ports.server,
        web = ports.web,
        probe = ports.probe,
        token = setup.server_token,
        transport = setup.transport,
        insecure = setup.insecure,
        quic = quic_server_table(setup.transport),
    )
}

/// `[server.quic]` for a QUIC server: its self-signed certificate in [`reused_temp_dir`]
/// (not the user's state directory; the first server makes it atomically, every later
/// one and every later run reuses it); nothing for the TCP transports.
pub fn quic_server_table(transport: &str) -> String {
    if transport != "quic" {
        return String::new();
    }
    let cert = reused_temp_dir("e2e-quic").join("quic.pem");
    format!("\n[server.quic]\ncert = \"{}\"\n", cert.display())
}

/// A client config serving `web` from `target` and `probe` from `probe_target`.
pub fn client_toml(
    setup: &Setup,
    ports: Ports,
    target: SocketAddr,
    probe_target: SocketAddr,
) -> String {
    let ciphers = match &setup.client_ciphers {
        Some(list) => format!(
            "ciphers = [{}]\n",
            list.iter()
                .map(|c| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => String::new(),
    };
    format!(
        r#"# e2e client
[client]
server = "127.0.0.1:{server}"
psk = "${{WARREN_PSK}}"
default_token = "{token}"
transport = "{transport}"
insecure = {insecure}
{ciphers}heartbeat_timeout = "3s"
reconnect_initial_delay = "100ms"
reconnect_max_delay = "500ms"
handshake_timeout = "5s"

[client.services.web]
target = "{target}"
{web}
[client.services.probe]
target = "{probe_target}"
"#,
        server = ports.server,
        token = setup.client_token,
        transport = setup.transport,
        insecure = setup.insecure,
        web = setup.client_web,
    )
}

// ---------------------------------------------------------------------------------------
// Tunnels

/// A `warren server` and a `warren client` (real processes) around one target.
pub struct Tunnel {
    /// The server process.
    pub server: Proc,
    /// The client process.
    pub client: Proc,
    /// The ports.
    pub ports: Ports,
    /// The server config file.
    pub server_config: PathBuf,
    /// The client config file.
    pub client_config: PathBuf,
    /// The setup both configs came from.
    pub setup: Setup,
}

/// Builds a [`Tunnel`]: `Tunnel::to(target).cipher("aes-128-gcm").start(&dir).await`.
#[derive(Clone)]
pub struct TunnelBuilder {
    target: SocketAddr,
    setup: Setup,
}

impl Tunnel {
    /// A tunnel whose `web` service forwards to `target`.
    pub fn to(target: SocketAddr) -> TunnelBuilder {
        TunnelBuilder {
            target,
            setup: Setup::default(),
        }
    }

    /// The `web` service address visitors connect to.
    pub fn service(&self) -> SocketAddr {
        loopback(self.ports.web)
    }

    /// Starts the server again from its config file (after [`Proc::kill`]).
    pub fn restart_server(&mut self, dir: &TestDir) {
        self.server.kill();
        self.server = start_server(dir, &self.server_config);
    }

    /// Waits until a visitor of the `probe` service gets its bytes echoed back (at most
    /// [`READY_TIMEOUT`]); panics with the logs otherwise.
    pub async fn wait_ready(&mut self) {
        if let Err(why) = self.try_ready().await {
            panic!("{why}\n{}", self.logs());
        }
    }

    /// Like [`Tunnel::wait_ready`], but returns why the tunnel did not come up.
    async fn try_ready(&mut self) -> Result<(), String> {
        let probe = loopback(self.ports.probe);
        let deadline = Instant::now() + READY_TIMEOUT;
        // Bounded by the deadline: each attempt takes at most ~1 s plus a 50 ms pause.
        loop {
            if probe_echo(probe).await {
                return Ok(());
            }
            let server_exit = self.server.try_status();
            let client_exit = self.client.try_status();
            if Instant::now() >= deadline || server_exit.is_some() || client_exit.is_some() {
                return Err(format!(
                    "the tunnel did not work within {READY_TIMEOUT:?} (server exit: {server_exit:?}, client exit: {client_exit:?})"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the server exited because one of its ports was taken in the meantime (the
    /// ports are free when picked, but another process may bind them before the server).
    fn lost_a_port_race(&mut self) -> bool {
        self.server.try_status().is_some() && self.server.stderr().contains("cannot bind")
    }

    /// The logs of both sides, for failure messages.
    pub fn logs(&self) -> String {
        format!("{}\n{}", self.server.logs(), self.client.logs())
    }
}

impl TunnelBuilder {
    /// Changes the whole setup.
    pub fn setup(mut self, setup: Setup) -> Self {
        self.setup = setup;
        self
    }

    /// Offers only `cipher` from the client.
    pub fn cipher(mut self, cipher: &'static str) -> Self {
        self.setup.client_ciphers = Some(vec![cipher]);
        self
    }

    /// Writes the configs, starts both processes and the probe target, and waits until the
    /// tunnel works.
    /// Picks new ports and retries (at most 3 times in all) if the server lost a port race.
    pub async fn start(self, dir: &TestDir) -> Tunnel {
        let mut attempt = 1;
        loop {
            let mut tunnel = self.clone().spawn(dir).await;
            match tunnel.try_ready().await {
                Ok(()) => return tunnel,
                Err(_) if attempt < 3 && tunnel.lost_a_port_race() => {
                    eprintln!("a picked port was taken before the server bound it; retrying");
                    attempt += 1;
                }
                Err(why) => panic!("{why}\n{}", tunnel.logs()),
            }
        }
    }

    /// Like [`TunnelBuilder::start`] without waiting.
    pub async fn spawn(self, dir: &TestDir) -> Tunnel {
        let ports = Ports::pick();
        let probe_target = echo_target().await;
        let server_config = dir.write("server.toml", &server_toml(&self.setup, ports));
        let client_config = dir.write(
            "client.toml",
            &client_toml(&self.setup, ports, self.target, probe_target),
        );
        let server = start_server(dir, &server_config);
        let client = start_client(dir, &client_config, &self.setup.client_psk);
        Tunnel {
            server,
            client,
            ports,
            server_config,
            client_config,
            setup: self.setup,
        }
    }
}

/// `warren server FILE` with the shared PSK.
pub fn start_server(dir: &TestDir, config: &Path) -> Proc {
    let config = config.to_str().expect("utf-8 temp path");
    Proc::warren(dir, "server", &["server", config], &[("WARREN_PSK", PSK)])
}

/// `warren client FILE` with `psk`.
pub fn start_client(dir: &TestDir, config: &Path, psk: &str) -> Proc {
    let config = config.to_str().expect("utf-8 temp path");
    Proc::warren(dir, "client", &["client", config], &[("WARREN_PSK", psk)])
}

/// One echo round trip through `addr` within 1 s.
async fn probe_echo(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(b"probe").await?;
        stream.shutdown().await?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await?;
        std::io::Result::Ok(reply == b"probe")
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), attempt).await,
        Ok(Ok(true))
    )
}

// ---------------------------------------------------------------------------------------
// Targets and visitors

/// An echo target on a spawned task of the current runtime.
pub async fn echo_target() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
    let addr = listener.local_addr().expect("echo addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// A UDP echo target on a spawned task of the current runtime.
pub async fn udp_echo_target() -> SocketAddr {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind udp echo");
    let addr = socket.local_addr().expect("udp echo addr");
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok((len, peer)) = socket.recv_from(&mut buf).await {
            let _ = socket.send_to(&buf[..len], peer).await;
        }
    });
    addr
}

/// The `--json` events a command printed, one per line (other lines skipped).
pub fn json_events(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// What the hashing target saw on one connection.
#[derive(Debug, Clone, Copy)]
pub struct Served {
    /// BLAKE3 of everything the target read (up to the visitor's FIN).
    pub received: blake3::Hash,
    /// BLAKE3 of the fresh random reply the target sent.
    pub sent: blake3::Hash,
    /// How many reply bytes the target sent.
    pub sent_len: usize,
}

/// A target that, per connection, reads to EOF, hashes what it got, writes back `reply_len`
/// fresh random bytes, closes, and reports both hashes on the returned channel (out of
/// band), so the visitor can check both directions.
pub async fn hashing_target(reply_len: usize) -> (SocketAddr, mpsc::Receiver<Served>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind target");
    let addr = listener.local_addr().expect("target addr");
    let (tx, rx) = mpsc::channel(1024);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut received = Vec::new();
                if stream.read_to_end(&mut received).await.is_err() {
                    return;
                }
                let reply = random_bytes(reply_len);
                if stream.write_all(&reply).await.is_err() || stream.shutdown().await.is_err() {
                    return;
                }
                let _ = tx
                    .send(Served {
                        received: blake3::hash(&received),
                        sent: blake3::hash(&reply),
                        sent_len: reply.len(),
                    })
                    .await;
            });
        }
    });
    (addr, rx)
}

/// Sends `payload` to `service`, half-closes, reads the reply to EOF (both at once).
pub async fn round_trip(service: SocketAddr, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(service).await?;
    let (mut r, mut w) = stream.split();
    let send = async {
        w.write_all(payload).await?;
        w.shutdown().await
    };
    let mut reply = Vec::new();
    let recv = r.read_to_end(&mut reply);
    tokio::try_join!(send, recv)?;
    Ok(reply)
}

/// Runs `visitors` concurrent visitors through `service` against a [`hashing_target`], each
/// sending `up` random bytes and expecting `down` bytes back; checks every hash in both
/// directions against what the target reported. Returns the bytes moved each way.
pub async fn hashed_transfers(
    service: SocketAddr,
    served: &mut mpsc::Receiver<Served>,
    visitors: usize,
    up: usize,
    down: usize,
) -> (usize, usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..visitors {
        tasks.spawn(async move {
            // Lengths differ a little so that no two payloads line up by chance.
            let payload = random_bytes(up + i * 7 + 1);
            let reply = round_trip(service, &payload)
                .await
                .unwrap_or_else(|e| panic!("visitor {i}: transfer failed: {e}"));
            (
                blake3::hash(&payload),
                payload.len(),
                blake3::hash(&reply),
                reply.len(),
            )
        });
    }
    let mut results = Vec::with_capacity(visitors);
    while let Some(done) = tasks.join_next().await {
        results.push(done.expect("visitor task"));
    }
    // The target reports right after its FIN, so each report is at most moments away.
    let mut reports = std::collections::HashMap::new();
    while reports.len() < visitors {
        let report = tokio::time::timeout(Duration::from_secs(10), served.recv())
            .await
            .expect("the target reports every connection within 10s")
            .expect("target alive");
        reports.insert(report.received, report);
    }
    let (mut total_up, mut total_down) = (0, 0);
    for (i, (sent_hash, sent_len, reply_hash, reply_len)) in results.iter().enumerate() {
        let report = reports.get(sent_hash).unwrap_or_else(|| {
            panic!("visitor {i}: the target never received exactly the bytes sent (upload corrupted or cut)")
        });
        assert_eq!(
            *reply_len, report.sent_len,
            "visitor {i}: reply length differs"
        );
        assert_eq!(
            *reply_hash, report.sent,
            "visitor {i}: target -> visitor bytes differ"
        );
        total_up += sent_len;
        total_down += reply_len;
    }
    assert_eq!(down * visitors, total_down);
    (total_up, total_down)
}

/// Whether `tool` is on PATH; without it the test named `test` is skipped (with a line
/// saying how to install `package`), or fails when `WARREN_E2E_REQUIRE_TOOLS=1` (CI).
pub fn have_tool(tool: &str, package: &str, test: &str) -> bool {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var("WARREN_E2E_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!(
                "{tool} is not on PATH but WARREN_E2E_REQUIRE_TOOLS=1: apt-get install {package}"
            );
        }
        eprintln!("SKIPPED {test}: {tool} is not on PATH (apt-get install {package})");
    }
    found
}

/// How long a process may take to start listening: on a loaded machine a start that
/// takes 80 ms when quiet has been seen to take over 5 s, and a slow start is not a failure.
pub const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits until something listens on `port` (at most [`LISTEN_TIMEOUT`]).
pub async fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + LISTEN_TIMEOUT;
    while TcpStream::connect(loopback(port)).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start listening on {port} within {LISTEN_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Proc {
    /// Waits until this process listens on `port` (at most [`LISTEN_TIMEOUT`]); fails at
    /// once, with its logs, if it exits first.
    pub async fn wait_listening(&mut self, port: u16) {
        let deadline = Instant::now() + LISTEN_TIMEOUT;
        let started = Instant::now();
        while TcpStream::connect(loopback(port)).await.is_err() {
            if let Some(status) = self.try_status() {
                panic!(
                    "{} exited ({status}) before listening on {port}:\n{}",
                    self.name,
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} did not start listening on {port} within {LISTEN_TIMEOUT:?}:\n{}",
                self.name,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if started.elapsed() > Duration::from_secs(2) {
            eprintln!(
                "{} took {:?} to listen on {port}",
                self.name,
                started.elapsed()
            );
        }
    }
}

/// nginx in the foreground, every path under `dir`, with `servers` (nginx `server {}`
/// blocks) inside its `http {}` block.
pub fn spawn_nginx(dir: &TestDir, servers: &str) -> Proc {
    let root = dir.path();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {root}/nginx.pid;\nerror_log {root}/nginx.error.log warn;\nevents {{ worker_connections 256; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {root}/body;\n  proxy_temp_path {root}/proxy;\n  fastcgi_temp_path {root}/fastcgi;\n  uwsgi_temp_path {root}/uwsgi;\n  scgi_temp_path {root}/scgi;\n  default_type application/octet-stream;\n{servers}\n}}\n",
        root = root.display(),
    );
    let conf_path = dir.write("nginx.conf", &conf);
    let nginx = if Path::new("/usr/sbin/nginx").is_file() {
        "/usr/sbin/nginx"
    } else {
        "nginx"
    };
    Proc::spawn(
        dir,
        "nginx",
        nginx,
        &["-c", conf_path.to_str().unwrap(), "-e", "stderr"],
        &[],
    )
}
