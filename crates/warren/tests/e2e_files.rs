//! End to end: `warren send` and `warren receive` as real processes through a real
//! `warren server` with `[server.p2p]`, on loopback. Every transfer is checked file by
//! file against BLAKE3 hashes of random contents; the routes (direct, relayed) are read
//! from the commands' `--json` events. The NAT matrix is `e2e_files_nat.rs`.

mod e2e_support;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e_support::{PSK, Proc, TestDir, free_port, json_events};
use rand::RngCore;
use serde_json::Value;

/// A transfer on loopback, 1 GiB included, ends well within this.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(120);

/// A `warren server` with `[server.p2p]` on a free loopback port.
struct FileServer {
    _proc: Proc,
    addr: String,
}

impl FileServer {
    async fn start(dir: &TestDir) -> FileServer {
        let port = free_port();
        let config = dir.write(
            "server.toml",
            &format!(
                "[server]\nbind = \"127.0.0.1:{port}\"\npsk = \"${{WARREN_PSK}}\"\n\n[server.p2p]\nrate_per_minute = 1000\n"
            ),
        );
        let mut proc = Proc::warren(
            dir,
            "server",
            &["server", config.to_str().unwrap()],
            &[("WARREN_PSK", PSK)],
        );
        let addr = format!("127.0.0.1:{port}");
        // The server listens once it logs its address; a TCP connect proves it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            assert!(
                proc.is_running() && tokio::time::Instant::now() < deadline,
                "the server did not start:\n{}",
                proc.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        FileServer { _proc: proc, addr }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("WARREN_PSK", PSK.into()),
            ("WARREN_SERVER", self.addr.clone()),
        ]
    }

    /// `warren send ARGS --json`, and the code it printed.
    async fn send(&self, dir: &TestDir, name: &str, args: &[&str]) -> (Proc, String) {
        let mut all = vec!["send", "--json"];
        all.extend_from_slice(args);
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut proc = Proc::warren(dir, name, &all, &env);
        let out = proc.wait_stdout("\"code\"", Duration::from_secs(10)).await;
        let code = json_events(&out)
            .into_iter()
            .find(|e| e["event"] == "code")
            .and_then(|e| e["code"].as_str().map(str::to_owned))
            .expect("a code event");
        (proc, code)
    }

    /// `warren receive --json --yes --out OUT ARGS` with the code in WARREN_CODE.
    fn receive(&self, dir: &TestDir, name: &str, code: &str, out: &Path, args: &[&str]) -> Proc {
        let mut all = vec!["receive", "--json", "--yes", "--out", out.to_str().unwrap()];
        all.extend_from_slice(args);
        let mut env = self.env();
        env.push(("WARREN_CODE", code.to_owned()));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Proc::warren(dir, name, &all, &env)
    }
}

/// The one event named `name`.
fn event(proc: &Proc, name: &str) -> Value {
    json_events(&proc.stdout())
        .into_iter()
        .find(|e| e["event"] == name)
        .unwrap_or_else(|| panic!("no {name} event:\n{}", proc.logs()))
}

/// Waits for a command to exit 0.
async fn succeeds(proc: &mut Proc) {
    let code = proc.expect_exit(TRANSFER_TIMEOUT).await;
    assert_eq!(code, 0, "exit code {code}\n{}", proc.logs());
}

/// Writes `len` random bytes to `path`, creating its folders.
fn random_file(path: &Path, len: usize) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len());
        rand::rng().fill_bytes(&mut buf[..n]);
        file.write_all(&buf[..n]).unwrap();
        left -= n;
    }
    file.flush().unwrap();
}

fn hash_file(path: &Path) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    hasher
        .update_reader(std::fs::File::open(path).unwrap())
        .unwrap();
    hasher.finalize()
}

/// Every file beneath `root`, by relative path, with its BLAKE3 hash.
fn hashes(root: &Path) -> BTreeMap<PathBuf, blake3::Hash> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, blake3::Hash>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let hash = hash_file(&path);
                out.insert(path.strip_prefix(root).unwrap().to_owned(), hash);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Asserts that `received` holds exactly the files of `sent`.
fn same_tree(sent: &Path, received: &Path) {
    let (want, got) = (hashes(sent), hashes(received));
    assert!(!want.is_empty());
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "the same file names"
    );
    for (name, hash) in &want {
        assert_eq!(Some(hash), got.get(name), "{} differs", name.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_arrives_byte_exact_over_the_direct_path() {
    let dir = TestDir::new("files-tree");
    let server = FileServer::start(&dir).await;
    let src = dir.path().join("src/photos");
    random_file(&src.join("big.bin"), 3 * 1024 * 1024 + 17);
    random_file(&src.join("nested/deeper/small.bin"), 1000);
    random_file(&src.join("empty"), 0);
    for i in 0..300 {
        random_file(&src.join(format!("many/{i:03}.txt")), 1 + i * 13);
    }
    let (mut sender, code) = server.send(&dir, "send", &[src.to_str().unwrap()]).await;
    let out = dir.path().join("out");
    let mut receiver = server.receive(&dir, "receive", &code, &out, &[]);
    succeeds(&mut receiver).await;
    succeeds(&mut sender).await;
    same_tree(&dir.path().join("src"), &out);
    for side in [&sender, &receiver] {
        assert_eq!(
            event(side, "connected")["route"],
            "direct",
            "{}",
            side.logs()
        );
        assert_eq!(event(side, "finished")["files"], 303);
    }
    let offer = event(&receiver, "offer");
    assert_eq!(offer["top_level"], serde_json::json!(["photos"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_code_fails_cleanly_and_the_right_one_still_works() {
    let dir = TestDir::new("files-wrong-code");
    let server = FileServer::start(&dir).await;
    let src = dir.path().join("note.txt");
    random_file(&src, 4096);
    let (mut sender, code) = server.send(&dir, "send", &[src.to_str().unwrap()]).await;
    let nameplate = code.split('-').next().unwrap();
    let wrong = format!("{nameplate}-zoom-zoom-zoom");
    let wrong = if wrong == code {
        format!("{nameplate}-acid-acid-acid")
    } else {
        wrong
    };
    let out = dir.path().join("out");
    let mut guesser = server.receive(&dir, "guesser", &wrong, &out, &[]);
    let exit = guesser.expect_exit(Duration::from_secs(30)).await;
    assert_eq!(exit, 1, "{}", guesser.logs());
    assert!(
        guesser.stderr().contains("code"),
        "the error names the code: {}",
        guesser.logs()
    );
    assert!(
        std::fs::read_dir(&out).unwrap().next().is_none(),
        "nothing written"
    );
    assert!(
        sender.is_running(),
        "the sender waits on: {}",
        sender.logs()
    );
    let mut receiver = server.receive(&dir, "receive", &code, &out, &[]);
    succeeds(&mut receiver).await;
    succeeds(&mut sender).await;
    assert_eq!(
        std::fs::read(out.join("note.txt")).unwrap(),
        std::fs::read(&src).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_file_is_kept_unless_overwrite_is_given() {
    let dir = TestDir::new("files-overwrite");
    let server = FileServer::start(&dir).await;
    let src = dir.path().join("report.pdf");
    random_file(&src, 100_000);
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("report.pdf"), b"mine").unwrap();

    let (mut sender, code) = server.send(&dir, "send1", &[src.to_str().unwrap()]).await;
    let mut receiver = server.receive(&dir, "receive1", &code, &out, &[]);
    assert_eq!(receiver.expect_exit(TRANSFER_TIMEOUT).await, 1);
    assert!(
        receiver.stderr().contains("--overwrite"),
        "the error names the flag: {}",
        receiver.logs()
    );
    assert_eq!(std::fs::read(out.join("report.pdf")).unwrap(), b"mine");
    assert_eq!(sender.expect_exit(TRANSFER_TIMEOUT).await, 1);

    let (mut sender, code) = server.send(&dir, "send2", &[src.to_str().unwrap()]).await;
    let mut receiver = server.receive(&dir, "receive2", &code, &out, &["--overwrite"]);
    succeeds(&mut receiver).await;
    succeeds(&mut sender).await;
    assert_eq!(
        std::fs::read(out.join("report.pdf")).unwrap(),
        std::fs::read(&src).unwrap()
    );
}

/// The size of the biggest file beneath `dir` (the partial file being written).
fn biggest_file(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok()?.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_gib_file_killed_half_way_resumes_sending_at_most_55_percent_again() {
    const SIZE: u64 = 1 << 30;
    let dir = TestDir::new("files-resume");
    let server = FileServer::start(&dir).await;
    let src = dir.path().join("disk.img");
    random_file(&src, SIZE as usize);
    let out = dir.path().join("out");

    let (mut sender, code) = server.send(&dir, "send1", &[src.to_str().unwrap()]).await;
    let mut receiver = server.receive(&dir, "receive1", &code, &out, &[]);
    // kill -9 once half the file is on disk (the partial file grows chunk by chunk).
    let deadline = tokio::time::Instant::now() + TRANSFER_TIMEOUT;
    while biggest_file(&out) < SIZE / 2 {
        assert!(
            receiver.is_running() && tokio::time::Instant::now() < deadline,
            "the receiver ended before half way:\n{}",
            receiver.logs()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    receiver.kill();
    sender.kill();
    assert!(!out.join("disk.img").exists(), "not complete yet");

    let (mut sender, code) = server.send(&dir, "send2", &[src.to_str().unwrap()]).await;
    let mut receiver = server.receive(&dir, "receive2", &code, &out, &[]);
    succeeds(&mut receiver).await;
    succeeds(&mut sender).await;
    assert_eq!(hashes(&out).len(), 1, "only the file, no leftovers");
    assert_eq!(hashes(&out)[Path::new("disk.img")], hash_file(&src));
    let finished = event(&receiver, "finished");
    let sent = finished["sent_bytes"].as_u64().unwrap();
    let resumed = finished["resumed_bytes"].as_u64().unwrap();
    assert!(
        sent * 100 <= SIZE * 55,
        "re-sent {sent} of {SIZE} bytes (resumed {resumed})"
    );
    assert_eq!(sent + resumed, SIZE, "{finished}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_of_1000_files_of_1_mib_arrives_byte_exact() {
    let dir = TestDir::new("files-1000");
    let server = FileServer::start(&dir).await;
    let src = dir.path().join("src/tree");
    for i in 0..1000 {
        random_file(&src.join(format!("d{}/f{i:04}.bin", i / 100)), 1 << 20);
    }
    let (mut sender, code) = server.send(&dir, "send", &[src.to_str().unwrap()]).await;
    let out = dir.path().join("out");
    let mut receiver = server.receive(&dir, "receive", &code, &out, &[]);
    succeeds(&mut receiver).await;
    succeeds(&mut sender).await;
    same_tree(&dir.path().join("src"), &out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_carries_the_transfer_when_asked_for() {
    let dir = TestDir::new("files-relay");
    let server = FileServer::start(&dir).await;
    let src = dir.path().join("src/data");
    random_file(&src.join("a.bin"), 8 * 1024 * 1024 + 5);
    random_file(&src.join("b/c.bin"), 70_000);
    let (mut sender, code) = server
        .send(&dir, "send", &["--relay", src.to_str().unwrap()])
        .await;
    let out = dir.path().join("out");
    let mut receiver = server.receive(&dir, "receive", &code, &out, &[]);
    succeeds(&mut receiver).await;
    succeeds(&mut sender).await;
    same_tree(&dir.path().join("src"), &out);
    for side in [&sender, &receiver] {
        let connected = event(side, "connected");
        assert_eq!(connected["route"], "relayed", "{}", side.logs());
        assert_eq!(
            connected["address"], server.addr,
            "through the server's UDP port"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_receivers_of_one_code_get_the_files_at_the_same_time() {
    let dir = TestDir::new("files-three");
    let server = FileServer::start(&dir).await;
    let src = dir.path().join("src/set");
    random_file(&src.join("one.bin"), 6 * 1024 * 1024);
    random_file(&src.join("two/three.bin"), 123_457);
    let (mut sender, code) = server
        .send(
            &dir,
            "send",
            &["--max-receivers", "3", src.to_str().unwrap()],
        )
        .await;
    let outs: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("out{i}"))).collect();
    let mut receivers: Vec<Proc> = outs
        .iter()
        .enumerate()
        .map(|(i, out)| server.receive(&dir, &format!("receive{i}"), &code, out, &[]))
        .collect();
    for receiver in &mut receivers {
        succeeds(receiver).await;
    }
    succeeds(&mut sender).await;
    for out in &outs {
        same_tree(&dir.path().join("src"), out);
    }
    // Each receiver had its own key exchange, identity and connection.
    let peers: std::collections::BTreeSet<String> = json_events(&sender.stdout())
        .into_iter()
        .filter(|e| e["event"] == "finished")
        .map(|e| e["peer"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(peers.len(), 3, "{}", sender.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_goes_to_the_receivers_stdout() {
    let dir = TestDir::new("files-stdio");
    let server = FileServer::start(&dir).await;
    let src = dir.path().join("piped.bin");
    random_file(&src, 2 * 1024 * 1024 + 3);
    let spawn = |args: &[&str], stdin: std::process::Stdio, stdout: &str, env: &[(&str, &str)]| {
        std::process::Command::new(e2e_support::WARREN)
            .args(args)
            .envs(env.iter().copied())
            .env("WARREN_PSK", PSK)
            .env("WARREN_SERVER", &server.addr)
            .stdin(stdin)
            .stdout(std::fs::File::create(dir.path().join(stdout)).unwrap())
            .stderr(std::fs::File::create(dir.path().join(format!("{stdout}.err"))).unwrap())
            .spawn()
            .unwrap()
    };
    let mut sender = spawn(
        &["send", "--json", "--name", "piped.bin", "-"],
        std::fs::File::open(&src).unwrap().into(),
        "send.out",
        &[],
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let code = loop {
        let out = std::fs::read_to_string(dir.path().join("send.out")).unwrap();
        if let Some(code) = json_events(&out)
            .into_iter()
            .find_map(|e| e["code"].as_str().map(str::to_owned))
        {
            break code;
        }
        assert!(tokio::time::Instant::now() < deadline, "no code");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let receiver = spawn(
        &["receive", "--yes", "--out", "-"],
        std::process::Stdio::null(),
        "received.bin",
        &[("WARREN_CODE", code.as_str())],
    );
    let received = tokio::task::spawn_blocking(move || receiver.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(received.status.success(), "receive failed");
    assert!(sender.wait().unwrap().success(), "send failed");
    assert_eq!(
        hash_file(&dir.path().join("received.bin")),
        hash_file(&src),
        "stdout holds exactly the bytes of stdin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_is_printed_by_the_receiver_and_nothing_is_written() {
    let dir = TestDir::new("files-text");
    let server = FileServer::start(&dir).await;
    let text = "two lines\nand a \u{1b}[31m colour";
    let (mut sender, code) = server.send(&dir, "send", &["--text", text]).await;
    let out = dir.path().join("out");
    let mut receiver = server.receive(&dir, "receive", &code, &out, &[]);
    succeeds(&mut receiver).await;
    succeeds(&mut sender).await;
    assert_eq!(event(&receiver, "text")["text"], text);
    assert!(
        std::fs::read_dir(&out).unwrap().next().is_none(),
        "nothing written"
    );
}
