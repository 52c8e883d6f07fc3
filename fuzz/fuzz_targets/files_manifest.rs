//! The manifest decoder (`proto::files::manifest`): never panics, stays within its bounds,
//! and whatever it accepts is valid, canonical (re-encodes to the same bytes) and made of
//! safe names with no twins.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_proto::files::manifest::{MAX_ENTRIES, MAX_MANIFEST_LEN};
use warren_proto::files::{EntryKind, Manifest, NameSet, SafeName};

fuzz_target!(|data: &[u8]| {
    let Ok(manifest) = Manifest::decode(data) else {
        return;
    };
    assert!(data.len() <= MAX_MANIFEST_LEN);
    assert!(manifest.entries().len() <= MAX_ENTRIES);
    assert_eq!(manifest.encode(), data, "canonical");
    assert_eq!(Manifest::new(manifest.entries().to_vec()).as_ref(), Ok(&manifest));

    let mut total: u64 = 0;
    let mut set = NameSet::new();
    for pair in manifest.entries().windows(2) {
        assert!(pair[0].name.as_str().as_bytes() < pair[1].name.as_str().as_bytes());
    }
    for entry in manifest.entries() {
        assert_eq!(SafeName::new(entry.name.as_str()).as_ref(), Ok(&entry.name));
        set.insert(&entry.name, entry.kind).expect("the decoder checked the set");
        if entry.kind == EntryKind::Dir {
            assert_eq!(entry.size, 0);
        }
        total = total.checked_add(entry.size).expect("no overflow");
    }
    assert_eq!(total, manifest.total_size());
});
