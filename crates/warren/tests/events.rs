//! Log event names stay consistent (issue 6, logs): every `event = "…"` the code writes is
//! `snake_case` and listed in `docs/events.md`, and the catalogue names no event the code
//! no longer writes. Operators filter and alert on these names, so they are an interface.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every `event = "name"` in the crate's sources.
fn events_in_code() -> BTreeSet<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut events = BTreeSet::new();
    for file in rust_files(&src) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (at, marker) in text.match_indices("event = \"") {
            let rest = &text[at + marker.len()..];
            events.insert(rest.split('"').next().unwrap().to_owned());
        }
    }
    events
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The first column of the table in `docs/events.md`: rows that start with "| `name` |".
fn events_in_catalogue() -> BTreeSet<String> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/events.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    text.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_owned)
        .collect()
}

fn is_snake_case(name: &str) -> bool {
    !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('_')
        && !name.contains("__")
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[test]
fn every_event_is_snake_case_and_catalogued() {
    let code = events_in_code();
    assert!(
        code.len() > 40,
        "the scan found only {} events; is it reading src/?",
        code.len()
    );
    let badly_named: Vec<_> = code.iter().filter(|e| !is_snake_case(e)).collect();
    assert!(
        badly_named.is_empty(),
        "event names must be snake_case: {badly_named:?}"
    );
    let catalogue = events_in_catalogue();
    let missing: Vec<_> = code.difference(&catalogue).collect();
    assert!(
        missing.is_empty(),
        "add these events to docs/events.md: {missing:?}"
    );
    let stale: Vec<_> = catalogue.difference(&code).collect();
    assert!(
        stale.is_empty(),
        "docs/events.md lists events the code no longer writes: {stale:?}"
    );
}

#[test]
fn snake_case_check_rejects_other_styles() {
    for good in ["session_started", "udp_stats", "fd_limit"] {
        assert!(is_snake_case(good), "{good}");
    }
    for bad in [
        "SessionStarted",
        "session-started",
        "session__x",
        "_x",
        "x_",
        "",
    ] {
        assert!(!is_snake_case(bad), "{bad}");
    }
}
