//! The command line refuses bad input with a message naming the problem and the fix, and
//! never panics. Needs neither root nor namespaces: every case fails before touching them.

use std::process::Command;

fn wanlab(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_wanlab"))
        .args(args)
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!err.contains("panicked"), "panic on {args:?}: {err}");
    (out.status.code().unwrap_or(-1), err)
}

#[test]
fn bad_input_gets_a_clear_error() {
    let base = [
        "run",
        "--ns-a",
        "wanlab-cli-missing-a",
        "--ns-b",
        "wanlab-cli-missing-b",
    ];
    let cases: &[(&[&str], &str)] = &[
        (
            &["--rate", "100furlong", "--delay", "20ms"],
            "no known unit",
        ),
        (&["--rate", "100mbit", "--delay", "20"], "no known unit"),
        (
            &["--rate", "100mbit", "--delay", "20ms", "--loss", "101%"],
            "over 100%",
        ),
        (&["--profile", "W9"], "known profiles: W1, W2, W3, W4"),
        (&["--rate", "100mbit"], "give --delay"),
        (
            &["--profile", "W2", "--queue-bdp", "0"],
            "must be a number above 0",
        ),
        (&["--profile", "W2"], "ip netns add wanlab-cli-missing-a"),
        (
            &["--profile", "W2", "--addr-a", "10.1.2.3"],
            "documentation ranges",
        ),
    ];
    for (extra, want) in cases {
        let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
        let (code, err) = wanlab(&args);
        assert_ne!(code, 0, "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: expected `{want}` in: {err}");
    }
}

#[test]
fn lists_profiles() {
    let out = Command::new(env!("CARGO_BIN_EXE_wanlab"))
        .arg("profiles")
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("W4: 100 ms one way, 200 Mbit/s, 0.1% loss"),
        "{s}"
    );
}
