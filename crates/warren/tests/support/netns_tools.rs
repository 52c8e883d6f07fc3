//! What the network-namespace tests share: whether they can run here (root, the tools
//! they need, working `ip netns`), skipping or failing accordingly, running a set-up
//! command, and hashing a received tree.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Why the namespace tests needing `tools` cannot run here, if they cannot.
pub fn unavailable(tools: &[&str]) -> Option<String> {
    // The effective uid, through `id -u` (no unsafe `geteuid`).
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root".into());
    }
    for tool in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            let package = match *tool {
                "ip" => "iproute2",
                "nft" => "nftables",
                other => other,
            };
            return Some(format!("`{tool}` not on PATH (apt-get install {package})"));
        }
    }
    let netns = Command::new("ip").args(["netns", "list"]).output();
    if !netns.is_ok_and(|o| o.status.success()) {
        return Some("`ip netns` does not work here".into());
    }
    None
}

/// Whether `test` (needing `tools`) must be skipped, printed with the reason; a failure
/// instead when `WARREN_NETNS_TESTS=1`.
pub fn skip(test: &str, tools: &[&str]) -> bool {
    match unavailable(tools) {
        None => false,
        Some(why) if std::env::var("WARREN_NETNS_TESTS").as_deref() == Ok("1") => {
            panic!("{test}: WARREN_NETNS_TESTS=1 but {why}")
        }
        Some(why) => {
            eprintln!("SKIPPED {test}: {why} (set WARREN_NETNS_TESTS=1 to make this a failure)");
            true
        }
    }
}

/// Runs a set-up command, which must succeed.
pub fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// BLAKE3 of every file under `dir`, by its `/`-separated path below `dir`.
pub fn hash_tree(dir: &Path) -> BTreeMap<String, blake3::Hash> {
    fn walk(base: &Path, dir: &Path, into: &mut BTreeMap<String, blake3::Hash>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(base, &path, into);
            } else {
                let rel = path.strip_prefix(base).unwrap();
                let rel = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                // A file gone by now hashes as empty: a mismatch, not a panic.
                let bytes = std::fs::read(&path).unwrap_or_default();
                into.insert(rel, blake3::hash(&bytes));
            }
        }
    }
    let mut hashes = BTreeMap::new();
    walk(dir, dir, &mut hashes);
    hashes
}
