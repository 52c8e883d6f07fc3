//! Files a test binary makes once and reuses on every run (shared by the in-process and the
//! end-to-end test support).

/// A directory in the temporary directory for files a test binary makes once and reuses
/// on every run (certificates): one per test executable, so runs do not leave a directory
/// each behind and two test binaries never share one. Whatever is put in it must appear
/// whole (written elsewhere, then renamed or linked in), as two runs of one binary may race.
pub fn reused_temp_dir(kind: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe()
        .ok()
        .and_then(|path| Some(path.file_stem()?.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "tests".to_owned());
    std::env::temp_dir().join(format!("warren-test-{kind}-{exe}"))
}
