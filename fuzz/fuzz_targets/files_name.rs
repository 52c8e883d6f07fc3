//! File names from a peer (`proto::files::name`): the checker never panics, and whatever it
//! accepts is safe to create beneath a folder on Linux, macOS and Windows.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_proto::files::name::{
    EntryKind, MAX_COMPONENT_LEN, MAX_DEPTH, MAX_NAME_LEN, NameSet, SafeName,
};
use warren_proto::files::escape_for_terminal;

fuzz_target!(|data: &[u8]| {
    // The escaped form of anything is printable: no control character reaches a terminal.
    let lossy = String::from_utf8_lossy(data);
    let shown = escape_for_terminal(&lossy);
    assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");

    // Names separated by NUL, checked one by one and then as a set.
    let mut set = NameSet::new();
    for (i, raw) in data.split(|&b| b == 0).enumerate() {
        let Ok(name) = SafeName::from_bytes(raw) else {
            continue;
        };
        let text = name.as_str();
        assert!(!text.is_empty() && text.len() <= MAX_NAME_LEN);
        assert!(!text.starts_with('/') && !text.contains('\\'));
        assert!(name.depth() <= MAX_DEPTH);
        for component in name.components() {
            assert!(!component.is_empty() && component != "." && component != "..");
            assert!(component.len() <= MAX_COMPONENT_LEN);
            assert!(!component.ends_with('.') && !component.ends_with(' '));
        }
        assert!(!text.chars().any(|c| c.is_control()));
        // Checked names show as themselves, apart from nothing: no escaping needed.
        assert_eq!(name.escaped(), text);
        // Round trip through the checker again.
        assert_eq!(SafeName::new(text).as_ref(), Ok(&name));
        let kind = if i % 2 == 0 { EntryKind::File } else { EntryKind::Dir };
        let before = set.len();
        match set.insert(&name, kind) {
            Ok(()) => assert_eq!(set.len(), before + 1),
            Err(_) => assert_eq!(set.len(), before, "a refused name leaves the set unchanged"),
        }
    }
});
