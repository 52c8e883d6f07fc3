//! The NAT matrix through P2P tunnels (issue 18, "Done when"): the release `warren server`
//! in the lab's public namespace; behind one NAT an sshd and a dnsmasq on loopback, each
//! offered by `warren p2p listen --json`; behind the other NAT, per run, one `warren p2p
//! connect` to each code, then `scp` of a random file through the TCP tunnel (checked by
//! hash) and `dig` through the UDP one. Every cell of the file-transfer matrix, each run's
//! route (direct or relayed) must be the expected one on both sides. The listeners serve
//! every run of a cell (one code, a new connection per run). The table prints with
//! `--nocapture`.
//!
//! Needs root, `ip`, `nft`, `iptables` (the lab), `sshd`, `ssh-keygen`, `scp`, `dnsmasq`
//! and `dig`; without them the test prints `SKIPPED …` and passes, unless
//! `WARREN_NETNS_TESTS=1` (`scripts/test.sh` sets it). `WARREN_LAB_RUNS` sets the runs per
//! cell (default 5), `WARREN_LAB_CELLS` picks cells.

#[path = "support/nat_lab.rs"]
mod nat_lab;
#[path = "support/netns_tools.rs"]
mod netns_tools;

use std::path::{Path, PathBuf};
use std::time::Duration;

use nat_lab::{Lab, PSK, SERVER, WARREN, expected, side_events, start_server};
use rand::RngCore;
use serde_json::Value;
use tokio::time::Instant;

/// sshd's and dnsmasq's ports on the listening peer's loopback.
const SSH_PORT: u16 = 2222;
const DNS_PORT: u16 = 5353;
/// The name dnsmasq answers, and its address.
const DNS_NAME: &str = "svc.p2p.test";
const DNS_ANSWER: &str = "10.11.12.13";
/// Size of the file `scp` fetches through the TCP tunnel.
const FILE_LEN: usize = (2 << 20) + 77;
/// A connect's wait for its tunnel (a relayed one: ~3 s of checks, then the relay).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(45);
/// `scp` or `dig` through a tunnel.
const TOOL_TIMEOUT: Duration = Duration::from_secs(30);

/// The lab's children: the shared reflector and classifier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nat_lab_child() {
    let _ = nat_lab::child().await;
}

/// The external programs, or why they are missing.
struct Tools {
    sshd: PathBuf,
    dnsmasq: PathBuf,
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn tools() -> Result<Tools, String> {
    for tool in ["ssh-keygen", "scp", "ssh", "dig"] {
        which(tool).ok_or_else(|| {
            format!("`{tool}` not found (apt-get install openssh-client dnsutils)")
        })?;
    }
    Ok(Tools {
        sshd: which("sshd").ok_or("`sshd` not found (apt-get install openssh-server)")?,
        dnsmasq: which("dnsmasq").ok_or("`dnsmasq` not found (apt-get install dnsmasq-base)")?,
    })
}

/// sshd's key pair, config and the file it serves, in the lab's directory.
struct SshSetup {
    client_key: PathBuf,
    config: PathBuf,
    file: PathBuf,
    file_hash: blake3::Hash,
}

fn ssh_setup(dir: &Path) -> SshSetup {
    let ssh = dir.join("ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    for key in ["host_key", "client_key"] {
        let made = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(ssh.join(key))
            .stdin(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(made.success(), "ssh-keygen failed");
    }
    std::fs::copy(ssh.join("client_key.pub"), ssh.join("authorized_keys")).unwrap();
    let config = ssh.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "Port {SSH_PORT}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\n\
             PidFile {}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\n\
             Subsystem sftp internal-sftp\nLogLevel ERROR\n",
            ssh.join("host_key").display(),
            ssh.join("authorized_keys").display(),
            ssh.join("sshd.pid").display(),
        ),
    )
    .unwrap();
    // The privilege separation directory sshd insists on.
    std::fs::create_dir_all("/run/sshd").unwrap();
    let mut bytes = vec![0u8; FILE_LEN];
    rand::rng().fill_bytes(&mut bytes);
    let file = dir.join("served.bin");
    std::fs::write(&file, &bytes).unwrap();
    SshSetup {
        client_key: ssh.join("client_key"),
        config,
        file,
        file_hash: blake3::hash(&bytes),
    }
}

/// Runs `program args` in namespace `ns`, waiting at most `within`; its exit code (`None`:
/// killed) and stdout.
fn run_in(
    lab: &mut Lab,
    ns: &str,
    name: &str,
    program: &str,
    args: &[&str],
    within: Duration,
) -> (Option<i32>, String) {
    let child = lab.spawn_cmd(ns, name, program, args, &[]);
    let status = lab.wait_exit(child, within);
    if status.is_none() {
        lab.kill(child);
    }
    (status.and_then(|s| s.code()), lab.stdout(child))
}

/// ssh and scp options for the lab: no user config, keys only, no host-key prompts or
/// files, errors only.
const QUIET_SSH: [&str; 10] = [
    "-F",
    "/dev/null",
    "-o",
    "BatchMode=yes",
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "LogLevel=ERROR",
];

/// `scp` of the served file from 127.0.0.1:`port` in namespace `ns` (through a tunnel,
/// or straight to sshd) into `dest`: its exit code.
fn scp(lab: &mut Lab, ns: &str, ssh: &SshSetup, port: u16, dest: &Path) -> Option<i32> {
    let key = ssh.client_key.to_str().unwrap().to_owned();
    let remote = format!("root@127.0.0.1:{}", ssh.file.display());
    let port = port.to_string();
    let mut args = vec!["-q", "-P", &port, "-i", &key];
    args.extend(QUIET_SSH);
    args.extend(["-o", "ConnectTimeout=10", &remote, dest.to_str().unwrap()]);
    run_in(lab, ns, "scp", "scp", &args, TOOL_TIMEOUT).0
}

/// `dig` through the tunnel at `port` in namespace `ns`: the answer, trimmed.
fn dig(lab: &mut Lab, ns: &str, port: u16) -> String {
    let port = port.to_string();
    let args = [
        "@127.0.0.1",
        "-p",
        &port,
        "+short",
        "+time=2",
        "+tries=3",
        DNS_NAME,
    ];
    run_in(lab, ns, "dig", "dig", &args, TOOL_TIMEOUT)
        .1
        .trim()
        .to_owned()
}

/// Starts sshd and dnsmasq in peer1's namespace and waits (bounded) until both answer
/// there.
fn start_services(lab: &mut Lab, tools: &Tools, ssh: &SshSetup) -> Result<(), String> {
    let ns = lab.ns("peer1");
    let sshd = lab.spawn_cmd(
        &ns,
        "sshd",
        tools.sshd.to_str().unwrap(),
        &["-D", "-e", "-f", ssh.config.to_str().unwrap()],
        &[],
    );
    let dns_port = format!("--port={DNS_PORT}");
    let address = format!("--address=/{DNS_NAME}/{DNS_ANSWER}");
    let pid = format!("--pid-file={}", lab.dir.join("dnsmasq.pid").display());
    let dnsmasq = lab.spawn_cmd(
        &ns,
        "dnsmasq",
        tools.dnsmasq.to_str().unwrap(),
        &[
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--log-facility=-",
            &dns_port,
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            &address,
            "--local=/p2p.test/",
            &pid,
            "--user=root",
        ],
        &[],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let probe = lab.dir.join("probe.bin");
    loop {
        let dns_ok = dig(lab, &ns, DNS_PORT) == DNS_ANSWER;
        // sshd, straight (no tunnel): scp inside peer1's namespace.
        let ssh_ok = scp(lab, &ns, ssh, SSH_PORT, &probe) == Some(0);
        if dns_ok && ssh_ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the services did not answer in peer1 within 10 s (dns {dns_ok}, ssh {ssh_ok}):\nsshd:\n{}\ndnsmasq:\n{}",
                lab.stderr(sshd),
                lab.stderr(dnsmasq)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn env(code: Option<String>) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("WARREN_PSK", PSK.to_owned()),
        ("WARREN_SERVER", SERVER.to_owned()),
    ];
    env.extend(code.map(|code| ("WARREN_CODE", code)));
    env
}

/// `warren p2p listen --KIND 127.0.0.1:PORT --json` in peer1's namespace; its index and
/// code.
fn listen(lab: &mut Lab, kind: &str, port: u16) -> Result<(usize, String), String> {
    let target = format!("127.0.0.1:{port}");
    let flag = format!("--{kind}");
    let ns = lab.ns("peer1");
    let listener = lab.spawn_cmd(
        &ns,
        &format!("listen-{kind}"),
        WARREN,
        &["p2p", "listen", &flag, &target, "--json"],
        &env(None),
    );
    let code = lab
        .wait_line(listener, "\"event\":\"code\"", Duration::from_secs(15))
        .and_then(|line| {
            serde_json::from_str::<Value>(&line).ok()?["code"]
                .as_str()
                .map(str::to_owned)
        });
    match code {
        Some(code) => Ok((listener, code)),
        None => Err(format!(
            "`warren p2p listen {flag}` printed no code:\n{}",
            lab.stderr(listener)
        )),
    }
}

/// One run of one tunnel: starts `warren p2p connect` in peer2's namespace bound on
/// `port`; its index.
fn start_connect(lab: &mut Lab, kind: &str, code: &str, port: u16) -> usize {
    let bind = format!("127.0.0.1:{port}");
    let ns = lab.ns("peer2");
    lab.spawn_cmd(
        &ns,
        &format!("connect-{kind}"),
        WARREN,
        &["p2p", "connect", "--bind", &bind, "--json"],
        &env(Some(code.to_owned())),
    )
}

/// Waits (bounded) until the connect `child` listens; why not, if it does not.
fn connected(lab: &mut Lab, kind: &str, child: usize) -> Result<usize, String> {
    if lab
        .wait_line(child, "\"event\":\"listening\"", CONNECT_TIMEOUT)
        .is_some()
    {
        Ok(child)
    } else {
        let logs = format!("{}{}", lab.stdout(child), lab.stderr(child));
        lab.kill(child);
        Err(format!(
            "`warren p2p connect` ({kind}) did not connect:\n{logs}"
        ))
    }
}

#[test]
fn ssh_and_dns_through_p2p_tunnels_in_every_nat_pairing() {
    if std::env::var("WARREN_LAB_SIDE").is_ok() || nat_lab::skip("p2p_tunnel_matrix") {
        return;
    }
    let tools = match tools() {
        Ok(tools) => tools,
        Err(why) if std::env::var("WARREN_NETNS_TESTS").as_deref() == Ok("1") => {
            panic!("p2p_tunnel_matrix: WARREN_NETNS_TESTS=1 but {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED p2p_tunnel_matrix: {why}");
            return;
        }
    };
    let runs = nat_lab::runs(5);
    let mut table = String::from(
        "| cell | expected | tcp route per run | udp route per run | scp byte-exact | dig answered |\n|---|---|---|---|---|---|\n",
    );
    let mut failures = Vec::new();
    let started = Instant::now();
    for (left, right, layout) in nat_lab::matrix_cells() {
        let cell = nat_lab::cell_name(left, right, layout);
        let expected = expected(left, right, layout);
        let cell_started = Instant::now();
        let mut lab = Lab::new(left, right, layout);
        failures.extend(lab.check_nats(left, right, layout));
        let server = start_server(&mut lab);
        let ssh = ssh_setup(&lab.dir);
        if let Err(error) = start_services(&mut lab, &tools, &ssh) {
            failures.push(format!("{cell}: {error}"));
            continue;
        }
        let listeners = listen(&mut lab, "tcp", SSH_PORT)
            .and_then(|tcp| Ok((tcp, listen(&mut lab, "udp", DNS_PORT)?)));
        let ((tcp_listener, tcp_code), (udp_listener, udp_code)) = match listeners {
            Ok(listeners) => listeners,
            Err(error) => {
                failures.push(format!("{cell}: {error}"));
                continue;
            }
        };
        let (mut tcp_routes, mut udp_routes, mut exact, mut answered) =
            (Vec::new(), Vec::new(), 0, 0);
        for run in 0..runs {
            let (tcp_port, udp_port) = (6000 + run as u16, 6100 + run as u16);
            let mut problems = Vec::new();
            // Both connect at once (each relayed one spends ~3 s on its checks first).
            let tcp = start_connect(&mut lab, "tcp", &tcp_code, tcp_port);
            let udp = start_connect(&mut lab, "udp", &udp_code, udp_port);
            let tcp = connected(&mut lab, "tcp", tcp);
            let udp = connected(&mut lab, "udp", udp);
            let dest = lab.dir.join(format!("got{run}.bin"));
            if tcp.is_ok() {
                let peer2 = lab.ns("peer2");
                let scp_exit = scp(&mut lab, &peer2, &ssh, tcp_port, &dest);
                let got = std::fs::read(&dest).map(|b| blake3::hash(&b)).ok();
                if got == Some(ssh.file_hash) {
                    exact += 1;
                } else {
                    problems.push(format!("scp exited {scp_exit:?} and the file differs"));
                }
                let _ = std::fs::remove_file(&dest);
            }
            if udp.is_ok() {
                let ns = lab.ns("peer2");
                let answer = dig(&mut lab, &ns, udp_port);
                if answer == DNS_ANSWER {
                    answered += 1;
                } else {
                    problems.push(format!("dig answered {answer:?}"));
                }
            }
            // Each side's route: the connect's `connected` event, and the listener's last.
            for (kind, outcome, listener, routes) in [
                ("tcp", &tcp, tcp_listener, &mut tcp_routes),
                ("udp", &udp, udp_listener, &mut udp_routes),
            ] {
                let child = match outcome {
                    Ok(child) => *child,
                    Err(error) => {
                        problems.push(error.clone());
                        routes.push("-".to_owned());
                        continue;
                    }
                };
                let visitor = side_events(&lab.stdout(child));
                let listening = side_events(&lab.stdout(listener));
                let route = visitor.route.clone().unwrap_or_else(|| "-".into());
                if visitor.route.as_deref() != Some(expected)
                    || listening.route.as_deref() != Some(expected)
                {
                    problems.push(format!(
                        "{kind}: expected {expected} on both sides: connect {:?} via {:?}, listen {:?} via {:?}",
                        visitor.route, visitor.address, listening.route, listening.address
                    ));
                }
                routes.push(route);
                lab.kill(child);
            }
            if !problems.is_empty() {
                failures.push(format!(
                    "{cell} run {run}: {}\nlisten tcp:\n{}{}\nlisten udp:\n{}{}\nserver:\n{}",
                    problems.join("; "),
                    lab.stdout(tcp_listener),
                    lab.stderr(tcp_listener),
                    lab.stdout(udp_listener),
                    lab.stderr(udp_listener),
                    lab.stderr(server)
                ));
            }
        }
        table.push_str(&format!(
            "| {cell} | {expected} | {} | {} | {exact}/{runs} | {answered}/{runs} |\n",
            tcp_routes.join(", "),
            udp_routes.join(", "),
        ));
        eprintln!(
            "{cell}: tcp {} udp {} in {:.1} s",
            tcp_routes.join(", "),
            udp_routes.join(", "),
            cell_started.elapsed().as_secs_f64()
        );
    }
    nat_lab::report(
        "warren p2p listen / connect",
        runs,
        started,
        &table,
        &failures,
    );
}

/// Issue 18's "a visitor connects while the path is still relayed, keeps its connection
/// while it moves to direct, bytes checked": port-restricted NATs on both sides (a direct
/// cell), the direct path blocked on peer2's router while the tunnel connects, so it
/// starts relayed; an ssh session streams the served file slowly (33 chunks over ~8 s)
/// through the tunnel; the block is lifted a second in; both sides must report the move
/// to the direct path, the stream must arrive byte-exact, and neither side may have lost
/// its connection.
/// `ssh` through the tunnel's entrance at `port` in peer2, streaming the served file in
/// 64 KiB chunks `pause` seconds apart (33 chunks); returns the child.
fn ssh_stream(lab: &mut Lab, ssh: &SshSetup, port: u16, pause: &str) -> usize {
    let remote = format!(
        "for i in $(seq 0 32); do dd if={} bs=65536 skip=$i count=1 status=none; sleep {pause}; done",
        ssh.file.display()
    );
    let key = ssh.client_key.to_str().unwrap().to_owned();
    let port_arg = port.to_string();
    let peer2 = lab.ns("peer2");
    let mut args = vec!["-p", &port_arg, "-i", &key];
    args.extend(QUIET_SSH);
    args.extend(["root@127.0.0.1", &remote]);
    lab.spawn_cmd(&peer2, "ssh-stream", "ssh", &args, &[])
}

/// Waits until the stream `child` ended well and its bytes are the served file's.
fn stream_checked(lab: &mut Lab, stream: usize, ssh: &SshSetup, logs: &dyn Fn(&Lab) -> String) {
    let status = lab.wait_exit(stream, Duration::from_secs(60));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "the ssh stream failed: {}\n{}",
        lab.stderr(stream),
        logs(lab)
    );
    let got = lab.stdout_bytes(stream);
    assert_eq!(got.len(), FILE_LEN, "{}", logs(lab));
    assert_eq!(
        blake3::hash(&got),
        ssh.file_hash,
        "the streamed bytes differ"
    );
}

/// The addresses of `child`'s `moved` events to `route`, in order.
fn moves(lab: &Lab, child: usize, route: &str) -> Vec<String> {
    lab.stdout(child)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event["event"] == "moved" && event["route"] == route)
        .filter_map(|event| event["address"].as_str().map(str::to_owned))
        .collect()
}

/// Polls until `child` moved to `route` `count` times, at most `within`.
fn wait_moves(lab: &Lab, child: usize, route: &str, count: usize, within: Duration) -> bool {
    let until = Instant::now() + within;
    while moves(lab, child, route).len() < count {
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

#[test]
fn a_relayed_tunnel_moves_to_the_direct_path_without_dropping_its_stream() {
    if std::env::var("WARREN_LAB_SIDE").is_ok() || nat_lab::skip("p2p_tunnel_upgrade") {
        return;
    }
    let tools = match tools() {
        Ok(tools) => tools,
        Err(why) if std::env::var("WARREN_NETNS_TESTS").as_deref() == Ok("1") => {
            panic!("p2p_tunnel_upgrade: WARREN_NETNS_TESTS=1 but {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED p2p_tunnel_upgrade: {why}");
            return;
        }
    };
    let (left, right) = (nat_lab::Nat::Port, nat_lab::Nat::Port);
    let mut lab = Lab::new(left, right, nat_lab::Layout::Separate);
    let server = start_server(&mut lab);
    let ssh = ssh_setup(&lab.dir);
    start_services(&mut lab, &tools, &ssh).expect("sshd and dnsmasq answer");
    // Router 2 drops router 1's public address: only the relay connects the peers.
    lab.block_direct(2, "203.0.113.11");
    let (listener, code) = listen(&mut lab, "tcp", SSH_PORT).expect("a code");
    let port = 6200;
    let connect = start_connect(&mut lab, "tcp", &code, port);
    let connect = connected(&mut lab, "tcp", connect).expect("connected");
    let first = side_events(&lab.stdout(connect));
    assert_eq!(
        first.route.as_deref(),
        Some("relayed"),
        "with the direct path blocked the tunnel starts relayed:\n{}",
        lab.stdout(connect)
    );
    let stream = ssh_stream(&mut lab, &ssh, port, "0.25");
    std::thread::sleep(Duration::from_secs(1));
    lab.unblock_direct(2);
    let logs = |lab: &Lab| {
        format!(
            "connect:\n{}{}\nlisten:\n{}{}\nserver:\n{}",
            lab.stdout(connect),
            lab.stderr(connect),
            lab.stdout(listener),
            lab.stderr(listener),
            lab.stderr(server)
        )
    };
    for (side, child) in [("connect", connect), ("listen", listener)] {
        assert!(
            lab.wait_line(child, "\"event\":\"moved\"", Duration::from_secs(30))
                .is_some(),
            "{side} never moved to the direct path:\n{}",
            logs(&lab)
        );
    }
    stream_checked(&mut lab, stream, &ssh, &logs);
    for (side, child) in [("connect", connect), ("listen", listener)] {
        let events = side_events(&lab.stdout(child));
        assert!(events.moved, "{side}");
        assert_eq!(
            events.route.as_deref(),
            Some("direct"),
            "{side}: {}",
            logs(&lab)
        );
        assert!(
            !lab.stdout(child).contains("\"event\":\"disconnected\""),
            "{side} lost its connection while moving:\n{}",
            logs(&lab)
        );
    }
    eprintln!(
        "p2p_tunnel_upgrade: relayed, then direct, {FILE_LEN} bytes streamed byte-exact across the move"
    );
}

/// A direct tunnel (full cone ↔ symmetric NAT) keeps its streams when the direct path
/// dies (it goes through the relay, then back to direct once the path works again) and
/// when the symmetric router forgets its mappings (a *rebinding*: the peer behind it
/// comes back from new ports, and the path follows).
#[test]
fn a_direct_tunnel_survives_a_dead_path_and_a_nat_rebinding_without_dropping_streams() {
    if std::env::var("WARREN_LAB_SIDE").is_ok() || nat_lab::skip("p2p_tunnel_rebinding") {
        return;
    }
    let tools = match tools().and_then(|tools| {
        which("conntrack")
            .map(|_| tools)
            .ok_or_else(|| "`conntrack` not found (apt-get install conntrack)".to_owned())
    }) {
        Ok(tools) => tools,
        Err(why) if std::env::var("WARREN_NETNS_TESTS").as_deref() == Ok("1") => {
            panic!("p2p_tunnel_rebinding: WARREN_NETNS_TESTS=1 but {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED p2p_tunnel_rebinding: {why}");
            return;
        }
    };
    let mut lab = Lab::new(
        nat_lab::Nat::Full,
        nat_lab::Nat::Symm,
        nat_lab::Layout::Separate,
    );
    let server = start_server(&mut lab);
    let ssh = ssh_setup(&lab.dir);
    start_services(&mut lab, &tools, &ssh).expect("sshd and dnsmasq answer");
    let (listener, code) = listen(&mut lab, "tcp", SSH_PORT).expect("a code");
    let port = 6300;
    let connect = start_connect(&mut lab, "tcp", &code, port);
    let connect = connected(&mut lab, "tcp", connect).expect("connected");
    let logs = |lab: &Lab| {
        format!(
            "connect:\n{}{}\nlisten:\n{}{}\nserver:\n{}",
            lab.stdout(connect),
            lab.stderr(connect),
            lab.stdout(listener),
            lab.stderr(listener),
            lab.stderr(server)
        )
    };
    assert_eq!(
        side_events(&lab.stdout(connect)).route.as_deref(),
        Some("direct"),
        "full cone and symmetric NATs connect directly:\n{}",
        logs(&lab)
    );
    let sides = [("connect", connect), ("listen", listener)];

    // 1. The direct path dies (router 2 drops router 1's address): both sides go through
    //    the relay; it comes back: both return to direct. One stream throughout.
    let stream = ssh_stream(&mut lab, &ssh, port, "0.5");
    std::thread::sleep(Duration::from_secs(1));
    lab.block_direct(2, "203.0.113.11");
    for (side, child) in sides {
        assert!(
            wait_moves(&lab, child, "relayed", 1, Duration::from_secs(20)),
            "{side} did not fall back to the relay:\n{}",
            logs(&lab)
        );
    }
    lab.unblock_direct(2);
    for (side, child) in sides {
        assert!(
            wait_moves(&lab, child, "direct", 1, Duration::from_secs(30)),
            "{side} did not return to the direct path:\n{}",
            logs(&lab)
        );
    }
    stream_checked(&mut lab, stream, &ssh, &logs);

    // 2. The symmetric router forgets every mapping: peer 2 comes back from new ports;
    //    the listening side follows it to its new address. One stream throughout.
    let before = moves(&lab, listener, "direct");
    let stream = ssh_stream(&mut lab, &ssh, port, "0.25");
    std::thread::sleep(Duration::from_secs(1));
    let router = lab.ns("nat2");
    let flushed = std::process::Command::new("ip")
        .args(["netns", "exec", &router, "conntrack", "-F"])
        .output()
        .expect("run conntrack");
    assert!(flushed.status.success(), "conntrack -F: {flushed:?}");
    assert!(
        wait_moves(
            &lab,
            listener,
            "direct",
            before.len() + 1,
            Duration::from_secs(20)
        ),
        "the listening side did not follow the rebound peer:\n{}",
        logs(&lab)
    );
    let after = moves(&lab, listener, "direct");
    assert_ne!(
        after.last(),
        before.last(),
        "a new address:\n{}",
        logs(&lab)
    );
    stream_checked(&mut lab, stream, &ssh, &logs);
    for (side, child) in sides {
        assert!(
            !lab.stdout(child).contains("\"event\":\"disconnected\""),
            "{side} lost its connection:\n{}",
            logs(&lab)
        );
    }
    eprintln!(
        "p2p_tunnel_rebinding: direct, relayed while the path was dead, direct again, then \
         followed the peer from {:?} to {:?}; two streams byte-exact",
        before.last(),
        after.last()
    );
}

/// `warren doctor --format json` of `config` (a client config) in namespace `ns`: the
/// check named `name`, as (status, message).
fn doctor_check(lab: &mut Lab, ns: &str, config: &Path, name: &str) -> (String, String) {
    let child = lab.spawn_cmd(
        ns,
        "doctor",
        WARREN,
        &["doctor", config.to_str().unwrap(), "--format", "json"],
        &env(None),
    );
    let exited = lab.wait_exit(child, Duration::from_secs(60));
    assert!(
        exited.is_some(),
        "warren doctor hung:\n{}",
        lab.stderr(child)
    );
    let report: Value = serde_json::from_str(&lab.stdout(child))
        .unwrap_or_else(|e| panic!("doctor printed no JSON ({e}):\n{}", lab.stdout(child)));
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no `{name}` check:\n{report:#}"));
    (
        check["status"].as_str().unwrap_or_default().to_owned(),
        check["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Issue 18's `warren doctor` NAT report, in the lab: behind each kind of NAT, the mapping
/// and filtering it names are the NAT's; and with P2P services configured, the visitors'
/// end's doctor visits the other end and says the path is direct (port-restricted NATs on
/// both sides).
#[test]
fn doctor_names_the_nat_and_visits_the_p2p_service() {
    use nat_lab::{Layout, Nat};
    if std::env::var("WARREN_LAB_SIDE").is_ok() || nat_lab::skip("p2p_doctor_nat") {
        return;
    }
    let mut table = String::from("| NAT | doctor says |\n|---|---|\n");
    for (nat, words) in [
        (Nat::None, &["no NAT"][..]),
        (
            Nat::Full,
            &["endpoint-independent", "lets in other ports"][..],
        ),
        (
            Nat::Restr,
            &["endpoint-independent", "lets in other ports"][..],
        ),
        (Nat::Port, &["endpoint-independent", "port-restricted"][..]),
        (Nat::Symm, &["endpoint-dependent", "port-restricted"][..]),
    ] {
        let mut lab = Lab::new(nat, Nat::Port, Layout::Separate);
        let server = start_server(&mut lab);
        let config = lab.dir.join("client.toml");
        std::fs::write(
            &config,
            format!("[client]\nserver = \"{SERVER}\"\npsk = \"${{WARREN_PSK}}\"\n"),
        )
        .unwrap();
        let peer1 = lab.ns("peer1");
        let (status, message) = doctor_check(&mut lab, &peer1, &config, "nat");
        for word in words {
            assert!(
                message.contains(word),
                "{}: doctor says {message:?}, which lacks {word:?}\nserver:\n{}",
                nat.name(),
                lab.stderr(server)
            );
        }
        let expected = if nat == Nat::Symm { "warn" } else { "ok" };
        assert_eq!(status, expected, "{}: {message}", nat.name());
        table.push_str(&format!("| {} | {status}: {message} |\n", nat.name()));
    }
    // The visit: an exit in peer1 (the lab server's service `ssh`), doctor in peer2.
    let mut lab = Lab::new(Nat::Port, Nat::Port, Layout::Separate);
    let server = start_server(&mut lab);
    let service = |end: &str| {
        format!(
            "[client]\nserver = \"{SERVER}\"\npsk = \"${{WARREN_PSK}}\"\n[client.services.ssh]\n{end}\np2p = true\ntoken = \"{}\"\n",
            nat_lab::SERVICE_TOKEN
        )
    };
    let (exit, entrance) = (lab.dir.join("exit.toml"), lab.dir.join("entrance.toml"));
    std::fs::write(&exit, service("target = \"127.0.0.1:22\"")).unwrap();
    std::fs::write(&entrance, service("bind = \"127.0.0.1:6300\"")).unwrap();
    let peer1 = lab.ns("peer1");
    let client = lab.spawn_cmd(
        &peer1,
        "exit-client",
        WARREN,
        &["client", exit.to_str().unwrap()],
        &env(None),
    );
    assert!(
        lab.wait_stderr(client, "p2p_offered", Duration::from_secs(15))
            || lab.wait_stderr(client, "offered at the server", Duration::from_secs(1)),
        "the exit client never offered its service:\n{}\nserver:\n{}",
        lab.stderr(client),
        lab.stderr(server)
    );
    let peer2 = lab.ns("peer2");
    let (status, message) = doctor_check(&mut lab, &peer2, &entrance, "p2p ssh");
    assert_eq!(
        (status.as_str(), message.contains("direct path")),
        ("ok", true),
        "{message}\nexit client:\n{}",
        lab.stderr(client)
    );
    table.push_str(&format!("| port × port, visit | {status}: {message} |\n"));
    eprintln!("{table}");
}
