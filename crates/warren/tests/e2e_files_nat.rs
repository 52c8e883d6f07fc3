//! The NAT matrix through the real command line (issue 17, "Done when"): the release
//! `warren server` in the lab's public namespace, `warren send DIR --json` behind one NAT
//! and `warren receive --yes --json` behind the other, for every unordered pair of
//! {none, full, restr, port, symm} and for two peers behind one NAT. Each cell's route
//! (direct or relayed) must be the expected one on both sides in every run, and every
//! received tree byte-exact. The table prints with `--nocapture`. One sender serves three
//! receivers at once, each behind its own NAT (`--max-receivers`, issue 17's "three
//! receivers behind different NATs at once").
//!
//! The lab is `support/nat_lab.rs` (shared with `p2p_punch.rs`; the recipe is
//! `../shared/P2P.md`). Needs root, `ip`, `nft` and `iptables`; without them each test
//! prints `SKIPPED …` and passes, unless `WARREN_NETNS_TESTS=1` (`scripts/test.sh` sets it).
//! `WARREN_LAB_RUNS` sets the runs per cell (default 5; 2 for the three receivers).

#[path = "support/nat_lab.rs"]
mod nat_lab;
#[path = "support/netns_tools.rs"]
mod netns_tools;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nat_lab::{Lab, Layout, Nat, PSK, SERVER, Side, WARREN, expected, side_events, start_server};
use netns_tools::hash_tree;
use rand::RngCore;
use serde_json::Value;
use tokio::time::Instant;

/// A run's sender and receiver both exit within this (a relayed run: ~3 s of checks, the
/// relay, 3 MiB, the close).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The lab's children: the shared reflector and classifier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nat_lab_child() {
    let _ = nat_lab::child().await;
}

/// The files sent in every run: a nested folder, an empty file, a 3 MiB one.
struct Tree {
    _dir: tempfile::TempDir,
    /// The folder given to `warren send`.
    root: PathBuf,
    /// BLAKE3 of every file, by its path under the receiver's output folder.
    hashes: BTreeMap<String, blake3::Hash>,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::Builder::new()
            .prefix("warren-nat-tree-")
            .tempdir()
            .unwrap();
        let root = dir.path().join("tree");
        let files: [(&str, usize); 6] = [
            ("big.bin", (3 << 20) + 123),
            ("empty", 0),
            ("notes.txt", 1000),
            ("sub/d.bin", 4096),
            ("sub/deeper/c.bin", 65_537),
            ("sub/deeper/one", 1),
        ];
        for (name, len) in files {
            let path = root.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let mut bytes = vec![0u8; len];
            rand::rng().fill_bytes(&mut bytes);
            std::fs::write(path, bytes).unwrap();
        }
        let hashes = hash_tree(dir.path());
        assert_eq!(hashes.len(), files.len());
        Tree {
            _dir: dir,
            root,
            hashes,
        }
    }
}

/// Where the tree received into `out_dir` differs from `tree`, if it does.
fn tree_difference(tree: &Tree, out_dir: &Path) -> Option<String> {
    let got = hash_tree(out_dir);
    if got == tree.hashes {
        return None;
    }
    let differ: Vec<_> = tree
        .hashes
        .keys()
        .chain(got.keys())
        .filter(|k| tree.hashes.get(*k) != got.get(*k))
        .collect();
    Some(format!("the received tree differs at {differ:?}"))
}

/// One `warren send` / `warren receive` pair's result.
struct Run {
    /// Each side's `connected` event (sender, receiver).
    sides: [Side; 2],
    /// The receiver's connect time: from claiming the code to QUIC up.
    connect_ms: Option<u64>,
    /// The received tree is byte-exact.
    bytes_ok: bool,
    /// Each way the run fell short of the cell's expectation.
    problems: Vec<String>,
    /// Both sides' output, for the failure message.
    logs: String,
    /// Each side's exit code (`None`: killed after [`RUN_TIMEOUT`], or a signal) and when
    /// it exited, from the receiver's start (sender, receiver).
    exits: [(Option<i32>, Duration); 2],
}

/// Waits for every child in `children` to exit, at most `within` in all, killing those
/// still running then; returns each one's exit code (`None`: killed, or ended by a signal)
/// and when it exited.
fn wait_all(
    lab: &mut Lab,
    children: &[Option<usize>],
    within: Duration,
) -> Vec<(Option<i32>, Duration)> {
    let started = Instant::now();
    let mut exits = vec![None; children.len()];
    loop {
        for (n, child) in children.iter().enumerate() {
            if let (Some(child), None) = (child, exits[n])
                && let Some(status) = lab.try_status(*child)
            {
                exits[n] = Some((status.code(), started.elapsed()));
            }
        }
        let running = children
            .iter()
            .zip(&exits)
            .any(|(child, exit)| child.is_some() && exit.is_none());
        if !running || started.elapsed() >= within {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut result = vec![(None, started.elapsed()); children.len()];
    for (n, child) in children.iter().enumerate() {
        match (child, exits[n]) {
            (_, Some(exit)) => result[n] = exit,
            (Some(child), None) => lab.kill(*child),
            (None, None) => result[n] = (None, Duration::ZERO),
        }
    }
    result
}

/// The code `warren send --json` (child `sender`) printed, waiting for it (bounded).
fn code_of(lab: &mut Lab, sender: usize) -> Option<String> {
    lab.wait_line(sender, "\"event\":\"code\"", Duration::from_secs(15))
        .and_then(|line| {
            serde_json::from_str::<Value>(&line).ok()?["code"]
                .as_str()
                .map(str::to_owned)
        })
}

/// One transfer: `warren send` in peer1's namespace, `warren receive` in peer2's.
fn transfer(lab: &mut Lab, tree: &Tree, run: usize) -> Run {
    let env = |extra: Option<(&'static str, String)>| {
        let mut env = vec![
            ("WARREN_PSK", PSK.to_owned()),
            ("WARREN_SERVER", SERVER.into()),
        ];
        env.extend(extra);
        env
    };
    let out_dir = lab.dir.join(format!("out{run}"));
    let root = tree.root.to_str().unwrap().to_owned();
    let sender = lab.spawn_cmd(
        &lab.ns("peer1"),
        "send",
        WARREN,
        &["send", &root, "--json"],
        &env(None),
    );
    let mut problems = Vec::new();
    let code = code_of(lab, sender);
    let mut receiver = None;
    if let Some(code) = code {
        receiver = Some(lab.spawn_cmd(
            &lab.ns("peer2"),
            "receive",
            WARREN,
            &[
                "receive",
                "--out",
                out_dir.to_str().unwrap(),
                "--yes",
                "--json",
            ],
            &env(Some(("WARREN_CODE", code))),
        ));
    } else {
        problems.push("the sender printed no code event".into());
    }
    // Both exit on their own, within one bound.
    let exits: [_; 2] = wait_all(lab, &[Some(sender), receiver], RUN_TIMEOUT)
        .try_into()
        .expect("one exit per child");
    let logs = format!(
        "--- sender stdout\n{}--- sender stderr\n{}--- receiver stdout\n{}--- receiver stderr\n{}",
        lab.stdout(sender),
        lab.stderr(sender),
        receiver.map(|r| lab.stdout(r)).unwrap_or_default(),
        receiver.map(|r| lab.stderr(r)).unwrap_or_default(),
    );
    for ((who, (code, after)), child) in ["sender", "receiver"]
        .into_iter()
        .zip(exits)
        .zip([Some(sender), receiver])
    {
        if child.is_some() && code != Some(0) {
            problems.push(format!("the {who} ended with {code:?} after {after:?}"));
        }
    }
    let sent = side_events(&lab.stdout(sender));
    let received = receiver
        .map(|r| side_events(&lab.stdout(r)))
        .unwrap_or_default();
    for (who, side) in [("sender", &sent), ("receiver", &received)] {
        if !side.finished {
            problems.push(format!("the {who} printed no finished event"));
        }
    }
    let difference = tree_difference(tree, &out_dir);
    let bytes_ok = difference.is_none();
    problems.extend(difference);
    let _ = std::fs::remove_dir_all(&out_dir);
    Run {
        connect_ms: received.connect_ms,
        sides: [sent, received],
        bytes_ok,
        problems,
        logs,
        exits,
    }
}

#[test]
fn send_and_receive_through_every_nat_pairing() {
    if std::env::var("WARREN_LAB_SIDE").is_ok() || nat_lab::skip("nat_matrix") {
        return;
    }
    let runs = nat_lab::runs(5);
    let cells = nat_lab::matrix_cells();
    let tree = Tree::new();
    let mut table = String::from(
        "| cell | expected | route per run | connect ms per run | byte-exact |\n|---|---|---|---|---|\n",
    );
    let mut failures = Vec::new();
    let started = Instant::now();
    for (left, right, layout) in cells {
        let cell = nat_lab::cell_name(left, right, layout);
        let expected = expected(left, right, layout);
        let cell_started = Instant::now();
        let mut lab = Lab::new(left, right, layout);
        failures.extend(lab.check_nats(left, right, layout));
        let server = start_server(&mut lab);
        let (mut routes, mut times, mut exact) = (Vec::new(), Vec::new(), 0);
        for run in 0..runs {
            let result = transfer(&mut lab, &tree, run);
            let mut problems = result.problems;
            let [sent, received] = &result.sides;
            let note = format!(
                "sender {:?} via {:?}, receiver {:?} via {:?}",
                sent.route, sent.address, received.route, received.address
            );
            if result
                .sides
                .iter()
                .any(|s| s.route.as_deref() != Some(expected))
            {
                problems.push(format!("expected {expected} on both sides: {note}"));
            }
            // Relayed means through the server's UDP port; direct means anywhere else.
            let via_server = |s: &Side| s.address.as_deref() == Some(SERVER);
            let relayed = expected == "relayed";
            if result
                .sides
                .iter()
                .any(|s| s.route.is_some() && via_server(s) != relayed)
            {
                problems.push(format!("the address does not match the route: {note}"));
            }
            // Behind one NAT the winner must be a host address, not the NAT's.
            let host = |s: &Side| {
                s.address
                    .as_ref()
                    .is_some_and(|a| a.starts_with("198.51.100."))
            };
            if layout == Layout::Shared && !result.sides.iter().all(host) {
                problems.push(format!("not a host candidate: {note}"));
            }
            if !problems.is_empty() {
                failures.push(format!(
                    "{cell} run {run}: {}\n{}\nserver:\n{}",
                    problems.join("; "),
                    result.logs,
                    lab.stderr(server)
                ));
            }
            routes.push(received.route.clone().unwrap_or_else(|| "-".into()));
            times.push(result.connect_ms.map_or("-".into(), |ms| ms.to_string()));
            exact += usize::from(result.bytes_ok);
        }
        table.push_str(&format!(
            "| {cell} | {expected} | {} | {} | {exact}/{runs} |\n",
            routes.join(", "),
            times.join(", "),
        ));
        eprintln!(
            "{cell}: {} in {:.1} s",
            routes.join(", "),
            cell_started.elapsed().as_secs_f64()
        );
    }
    nat_lab::report("warren send / receive", runs, started, &table, &failures);
}

/// All UDP dropped on the receiver's router (a network that passes only TCP): the
/// receiver's address discovery gets no answer, so it asks for the relay without checks
/// and carries its relay leg over its TCP session with the server (`p2p::net::tcp_leg`);
/// the sender joins the relay over UDP. The transfer is relayed and byte-exact.
#[test]
fn with_all_udp_blocked_the_receiver_relays_over_tcp() {
    if std::env::var("WARREN_LAB_SIDE").is_ok() || nat_lab::skip("udp_blocked") {
        return;
    }
    let tree = Tree::new();
    let mut lab = Lab::new(Nat::Port, Nat::Port, Layout::Separate);
    lab.block_udp(2);
    lab.start_reflectors();
    assert_eq!(lab.classify("peer1"), Ok("eim"));
    // The block holds: the receiver's side cannot even reach the reflector.
    assert!(lab.classify("peer2").is_err(), "UDP still passes nat2");
    let server = start_server(&mut lab);
    let run = transfer(&mut lab, &tree, 0);
    let [(sender_code, sender_after), (receiver_code, receiver_after)] = run.exits;
    println!(
        "all UDP blocked on the receiver's router: sender exit {sender_code:?} after {:.1} s, \
         receiver exit {receiver_code:?} after {:.1} s, routes {:?} / {:?}",
        sender_after.as_secs_f64(),
        receiver_after.as_secs_f64(),
        run.sides[0].route,
        run.sides[1].route,
    );
    let logs = || format!("{}\nserver:\n{}", run.logs, lab.stderr(server));
    assert_eq!(sender_code, Some(0), "{}", logs());
    assert_eq!(receiver_code, Some(0), "{}", logs());
    for side in &run.sides {
        assert_eq!(side.route.as_deref(), Some("relayed"), "{}", logs());
    }
    assert!(run.bytes_ok, "the tree arrived byte-exact:\n{}", logs());
}

/// Issue 17's "Done when", three receivers behind different NATs at once: `warren send
/// --max-receivers 3` behind a `port` NAT and, as soon as its code shows, three `warren
/// receive` with that code, each behind its own router (`full`, `restr`, `symm`), all
/// running together. Each receiver gets the whole tree byte-exact over the route its
/// pairing with the sender's NAT gives ([`expected`]: direct from behind `full` and
/// `restr`, relayed from behind `symm`, port × symm having no port prediction), and the
/// sender reports those same three routes (each direct one to that receiver's router)
/// and three finished transfers, then exits 0.
#[test]
fn three_receivers_behind_different_nats_at_once() {
    if std::env::var("WARREN_LAB_SIDE").is_ok() || nat_lab::skip("three_receivers") {
        return;
    }
    const SENDER: Nat = Nat::Port;
    const RECEIVERS: [Nat; 3] = [Nat::Full, Nat::Restr, Nat::Symm];
    let routes: Vec<_> = RECEIVERS
        .iter()
        .map(|&nat| expected(SENDER, nat, Layout::Separate))
        .collect();
    assert!(
        routes.contains(&"direct") && routes.contains(&"relayed"),
        "the mix covers a direct and a relayed receiver: {routes:?}"
    );
    let tree = Tree::new();
    let nats = [SENDER, RECEIVERS[0], RECEIVERS[1], RECEIVERS[2]];
    let mut lab = Lab::with_peers(&nats);
    let problems = lab.check_mappings("port sender, full + restr + symm receivers", &nats);
    assert!(problems.is_empty(), "the lab's NATs: {problems:#?}");
    let server = start_server(&mut lab);
    let runs = nat_lab::runs(2);
    let started = Instant::now();
    let mut failures = Vec::new();
    for run in 0..runs {
        let result = fan_out(&mut lab, &tree, run, SENDER, &RECEIVERS);
        println!("three receivers, run {run}:\n{}", result.summary);
        if !result.problems.is_empty() {
            failures.push(format!(
                "run {run}: {}\n{}\nserver:\n{}",
                result.problems.join("; "),
                result.logs,
                lab.stderr(server)
            ));
        }
    }
    println!(
        "three receivers behind full, restr and symm from behind port: {runs} runs in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A [`fan_out`]'s result.
struct FanOut {
    /// Each way the run fell short.
    problems: Vec<String>,
    /// A line per receiver and one for the sender: route, connect time, bytes, exit.
    summary: String,
    /// Every side's output, for the failure message.
    logs: String,
}

/// One `warren send --max-receivers N` in `peer1` (behind `sender_nat`) and N `warren
/// receive` with its code, receiver `i` in `peer{i + 2}` (behind `receivers[i]`), all
/// started right after the code shows; every process exits within [`RUN_TIMEOUT`] or
/// is killed.
fn fan_out(lab: &mut Lab, tree: &Tree, run: usize, sender_nat: Nat, receivers: &[Nat]) -> FanOut {
    let env = |extra: Option<(&'static str, String)>| {
        let mut env = vec![
            ("WARREN_PSK", PSK.to_owned()),
            ("WARREN_SERVER", SERVER.into()),
        ];
        env.extend(extra);
        env
    };
    let root = tree.root.to_str().unwrap().to_owned();
    let max = receivers.len().to_string();
    let sender = lab.spawn_cmd(
        &lab.ns("peer1"),
        "send",
        WARREN,
        &["send", &root, "--json", "--max-receivers", &max],
        &env(None),
    );
    let mut problems = Vec::new();
    let code = code_of(lab, sender);
    let mut children = vec![Some(sender)];
    let mut out_dirs = Vec::new();
    for (i, _) in (2..).zip(receivers) {
        let out_dir = lab.dir.join(format!("out{run}-peer{i}"));
        let child = code.as_ref().map(|code| {
            lab.spawn_cmd(
                &lab.ns(&format!("peer{i}")),
                &format!("receive{i}"),
                WARREN,
                &[
                    "receive",
                    "--out",
                    out_dir.to_str().unwrap(),
                    "--yes",
                    "--json",
                ],
                &env(Some(("WARREN_CODE", code.clone()))),
            )
        });
        children.push(child);
        out_dirs.push(out_dir);
    }
    if code.is_none() {
        problems.push("the sender printed no code event".into());
    }
    // Everyone exits on their own, within one bound.
    let exits = wait_all(lab, &children, RUN_TIMEOUT);
    let mut logs = format!(
        "--- sender stdout\n{}--- sender stderr\n{}",
        lab.stdout(sender),
        lab.stderr(sender)
    );
    let mut summary = String::new();
    // What the sender must report: per receiver, its route and where the path goes (a
    // direct one to that receiver's router, a relayed one to the server).
    let mut wanted = Vec::new();
    for (n, ((i, &nat), out_dir)) in (2..).zip(receivers).zip(&out_dirs).enumerate() {
        let who = format!("the receiver behind {} (peer{i})", nat.name());
        let route = expected(sender_nat, nat, Layout::Separate);
        wanted.push(match route {
            "relayed" => format!("relayed via {SERVER}"),
            _ => format!("direct via {}", nat_lab::wan(i)),
        });
        let Some(child) = children[n + 1] else {
            continue;
        };
        let (code, after) = exits[n + 1];
        let stdout = lab.stdout(child);
        logs.push_str(&format!(
            "--- {who} stdout\n{stdout}--- {who} stderr\n{}",
            lab.stderr(child)
        ));
        if code != Some(0) {
            problems.push(format!("{who} ended with {code:?} after {after:?}"));
        }
        let side = side_events(&stdout);
        if !side.finished {
            problems.push(format!("{who} printed no finished event"));
        }
        // Direct: to the sender's router; relayed: through the server.
        let address_ok = match route {
            "relayed" => side.address.as_deref() == Some(SERVER),
            _ => side
                .address
                .as_deref()
                .is_some_and(|a| a.starts_with(&format!("{}:", nat_lab::wan(1)))),
        };
        if side.route.as_deref() != Some(route) || !address_ok {
            problems.push(format!(
                "{who}: expected {route}, got {:?} via {:?}",
                side.route, side.address
            ));
        }
        let difference = tree_difference(tree, out_dir);
        let exact = if difference.is_none() {
            "byte-exact"
        } else {
            "NOT byte-exact"
        };
        problems.extend(difference.map(|d| format!("{who}: {d}")));
        summary.push_str(&format!(
            "  {} × {}: {} via {}, connected in {} ms, {} files {exact}, exit {code:?} after {:.1} s\n",
            sender_nat.name(),
            nat.name(),
            side.route.as_deref().unwrap_or("-"),
            side.address.as_deref().unwrap_or("-"),
            side.connect_ms.map_or("-".into(), |ms| ms.to_string()),
            tree.hashes.len(),
            after.as_secs_f64(),
        ));
        let _ = std::fs::remove_dir_all(out_dir);
    }
    // The sender: one connected and one finished event per receiver, exit 0.
    let (code, after) = exits[0];
    if code != Some(0) {
        problems.push(format!("the sender ended with {code:?} after {after:?}"));
    }
    let events: Vec<Value> = lab
        .stdout(sender)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let of = |kind: &str| {
        events
            .iter()
            .filter(|e| e["event"].as_str() == Some(kind))
            .collect::<Vec<_>>()
    };
    let mut reported: Vec<String> = of("connected")
        .iter()
        .map(|e| {
            let route = e["route"].as_str().unwrap_or("-");
            let address = e["address"].as_str().unwrap_or("-");
            match route {
                // Direct: the receiver's router, whichever port its NAT gave.
                "direct" => format!(
                    "direct via {}",
                    address.rsplit_once(':').map_or(address, |(ip, _)| ip)
                ),
                _ => format!("{route} via {address}"),
            }
        })
        .collect();
    reported.sort();
    wanted.sort();
    if reported != wanted {
        problems.push(format!(
            "the sender reported {reported:?}, expected {wanted:?}"
        ));
    }
    let finished = of("finished").len();
    if finished != receivers.len() {
        problems.push(format!(
            "the sender printed {finished} finished events for {} receivers",
            receivers.len()
        ));
    }
    summary.push_str(&format!(
        "  sender behind {}: {reported:?}, {finished} finished, exit {code:?} after {:.1} s",
        sender_nat.name(),
        after.as_secs_f64()
    ));
    FanOut {
        problems,
        summary,
        logs,
    }
}
