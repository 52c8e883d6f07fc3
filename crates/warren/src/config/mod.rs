//! Warren's configuration: TOML files and builders -> validated, typed config.
//!
//! # Layout
//!
//! Two layers, as in ripgrep's Low/HiArgs:
//! - [`file`](mod@file): the serde model of a file ([`file::FileConfig`]), every struct with
//!   `deny_unknown_fields`, values still close to the text.
//! - the typed config ([`Config`], [`ServerConfig`], [`ClientConfig`]): real types,
//!   defaults filled in, built from the file model with `TryFrom` or in code with
//!   [`ServerConfig::new`] / [`ClientConfig::new`]. Both paths share `validate()`.
//!
//! Loading ([`Config::load`], [`Config::from_toml_str`]) reports *every* problem at once,
//! each with its key path, `line:column` and a hint ([`ConfigErrors`]); `load.rs` explains
//! how. Strings may reference the environment as `${NAME}` ([`env`](mod@env)), which is how
//! secrets should get in; durations are strings with units ([`duration`]).
//!
//! Safety rules, relaxed only by `insecure = true`: a PSK is required, PSKs and tokens
//! have at least [`MIN_SECRET_LEN`] characters and are not the examples' `CHANGE-ME`
//! placeholders, `transport = "tcp"` and the `none` cipher are refused.

use std::path::Path;

mod convert;
pub mod duration;
pub mod env;
mod error;
pub mod file;
pub mod ha;
pub mod http;
mod load;
pub mod middleware;
pub mod p2p;
pub mod proxy;
pub mod quic;
mod suggest;
pub(crate) mod typed;
pub mod web;

pub use error::{ConfigError, ConfigErrors};
pub use typed::{
    AdminConfig, ClientConfig, ClientForward, ClientP2p, ClientService, DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_RECONNECT_INITIAL_DELAY,
    DEFAULT_RECONNECT_MAX_DELAY, DEFAULT_TRANSPORT_RETRY, DEFAULT_UDP_IDLE_TIMEOUT,
    DEFAULT_UDP_MAX_SESSIONS, HostPort, HostPortError, MAX_SERVICE_NAME_LEN, MAX_TRANSPORTS,
    MAX_UDP_MAX_SESSIONS, MIN_SECRET_LEN, P2pEnd, PLACEHOLDER_PREFIX, ProxyProtocol, ServerConfig,
    ServerForward, ServerService, ServiceKind, Transport, TransportEntry, TransportEntryError,
    UdpSettings, UnknownName, has_aes_hardware,
};

/// A whole config file: a server or a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Config {
    /// From a `[server]` section.
    Server(ServerConfig),
    /// From a `[client]` section.
    Client(ClientConfig),
}

impl Config {
    /// Parses and validates TOML text, expanding `${NAME}` from the process environment.
    /// `source_name` (usually the file name) prefixes every error line.
    ///
    /// # Errors
    ///
    /// [`ConfigErrors::Invalid`] with every problem found.
    pub fn from_toml_str(text: &str, source_name: &str) -> Result<Config, ConfigErrors> {
        Self::from_toml_str_with_env(text, source_name, &env::process_env)
    }

    /// Like [`Config::from_toml_str`], with `${NAME}` resolved by `env` instead of the
    /// process environment (for tests and `--check-config` against another environment).
    ///
    /// # Errors
    ///
    /// [`ConfigErrors::Invalid`] with every problem found.
    pub fn from_toml_str_with_env(
        text: &str,
        source_name: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigErrors> {
        load::load_str(text, source_name, env)
    }

    /// Reads and validates the file at `path`.
    ///
    /// # Errors
    ///
    /// [`ConfigErrors::Read`] if the file cannot be read, [`ConfigErrors::Invalid`] with
    /// every problem found otherwise.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = read_capped(path).map_err(|source| ConfigErrors::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// Runs the semantic rules of the side's `validate()`.
    ///
    /// # Errors
    ///
    /// [`ConfigErrors::Invalid`] listing every broken rule.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        match self {
            Config::Server(server) => server.validate(),
            Config::Client(client) => client.validate(),
        }
    }
}

/// Largest config file read. Configs are a few KiB; a path that names something huge or
/// endless (a device, a log file) is refused instead of read into memory.
pub const MAX_CONFIG_LEN: u64 = 1 << 20;

/// Largest secret file read (`--psk-file`, `--token-file`): a secret is one line.
pub const MAX_SECRET_FILE_LEN: u64 = 64 * 1024;

/// Reads a config file of at most [`MAX_CONFIG_LEN`] bytes.
fn read_capped(path: &Path) -> std::io::Result<String> {
    read_text_file(path, MAX_CONFIG_LEN)
}

/// Reads a UTF-8 file of at most `max` bytes; a larger one (or an endless one, such as a
/// device) fails with [`std::io::ErrorKind::FileTooLarge`] after reading `max + 1` bytes.
///
/// # Errors
/// The file cannot be opened or read, is not UTF-8, or is larger than `max`.
pub fn read_text_file(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("it is larger than {} KiB", max / 1024),
        ));
    }
    Ok(text)
}

/// The error for a file of the other side, e.g. a client file given to the server.
fn wrong_side(source_name: &str, wanted: &str, found: &str) -> ConfigErrors {
    ConfigErrors::Invalid {
        source_name: Some(source_name.to_owned()),
        errors: vec![
            ConfigError::new(
                found,
                format!("expected a [{wanted}] config, but this file has a [{found}] section"),
            )
            .with_hint(format!(
                "run `warren {found}` with this file, or pass a file with a [{wanted}] section"
            )),
        ],
    }
}

impl ServerConfig {
    /// Parses and validates TOML text that must hold a `[server]` section.
    ///
    /// # Errors
    ///
    /// As [`Config::from_toml_str`], plus an error if the file holds a client.
    pub fn from_toml_str(text: &str, source_name: &str) -> Result<ServerConfig, ConfigErrors> {
        match Config::from_toml_str(text, source_name)? {
            Config::Server(server) => Ok(server),
            Config::Client(_) => Err(wrong_side(source_name, "server", "client")),
        }
    }

    /// Reads and validates a file that must hold a `[server]` section.
    ///
    /// # Errors
    ///
    /// As [`Config::load`], plus an error if the file holds a client.
    pub fn load(path: &Path) -> Result<ServerConfig, ConfigErrors> {
        match Config::load(path)? {
            Config::Server(server) => Ok(server),
            Config::Client(_) => Err(wrong_side(&path.display().to_string(), "server", "client")),
        }
    }
}

impl ClientConfig {
    /// Parses and validates TOML text that must hold a `[client]` section.
    ///
    /// # Errors
    ///
    /// As [`Config::from_toml_str`], plus an error if the file holds a server.
    pub fn from_toml_str(text: &str, source_name: &str) -> Result<ClientConfig, ConfigErrors> {
        match Config::from_toml_str(text, source_name)? {
            Config::Client(client) => Ok(client),
            Config::Server(_) => Err(wrong_side(source_name, "client", "server")),
        }
    }

    /// Reads and validates a file that must hold a `[client]` section.
    ///
    /// # Errors
    ///
    /// As [`Config::load`], plus an error if the file holds a server.
    pub fn load(path: &Path) -> Result<ClientConfig, ConfigErrors> {
        match Config::load(path)? {
            Config::Client(client) => Ok(client),
            Config::Server(_) => Err(wrong_side(&path.display().to_string(), "client", "server")),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// Stands in for the secrets the examples read from the environment.
    fn example_env(name: &str) -> Option<String> {
        name.starts_with("WARREN_")
            .then(|| format!("example-{name}-0123456789abcdef"))
    }

    /// Every `*.toml` under the examples folders: this crate's, and the workspace's when
    /// this module lives in `crates/warren`.
    fn example_files() -> Vec<PathBuf> {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        for dir in [manifest.join("examples"), manifest.join("../../examples")] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|ext| ext == "toml") {
                    files.push(path);
                }
            }
        }
        files.sort();
        files
    }

    #[test]
    fn every_example_parses() {
        let files = example_files();
        assert!(
            !files.is_empty(),
            "no example configs found: the test would check nothing"
        );
        for path in files {
            let text = std::fs::read_to_string(&path).expect("example is readable");
            let name = path.display().to_string();
            // As shipped, only the CHANGE-ME placeholders may be refused...
            if let Err(errors) = Config::from_toml_str_with_env(&text, &name, &example_env) {
                for error in errors.errors() {
                    assert!(
                        error.message.contains("CHANGE-ME placeholder"),
                        "{name}: unexpected error: {error}"
                    );
                }
            }
            // ...and with them filled in, the example is valid.
            let filled = text.replace("CHANGE-ME", "filled-in-by-the-test");
            if let Err(errors) = Config::from_toml_str_with_env(&filled, &name, &example_env) {
                panic!("{errors}");
            }
        }
    }

    #[test]
    fn examples_refuse_their_placeholders() {
        let server_example = example_files()
            .into_iter()
            .find(|path| path.file_name().is_some_and(|name| name == "server.toml"))
            .expect("examples/server.toml exists");
        let text = std::fs::read_to_string(server_example).expect("readable");
        let errors = Config::from_toml_str_with_env(&text, "server.toml", &example_env)
            .expect_err("placeholders are refused");
        assert!(!errors.errors().is_empty());
        let Config::Server(server) = Config::from_toml_str_with_env(
            &text.replace("CHANGE-ME", "filled-in"),
            "server.toml",
            &example_env,
        )
        .expect("valid once filled") else {
            panic!("server example holds a server");
        };
        assert_eq!(server.services.len(), 2);
    }

    /// Fuzz-ish: truncations, line shuffles and byte flips of the examples never panic.
    #[test]
    fn never_panics_on_mangled_input() {
        let mut seeds: Vec<String> = example_files()
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok())
            .collect();
        seeds.push("[client]\nserver = \"[::1]:7000\"\npsk = \"${WARREN_PSK}\"\n[client.services.a]\ntarget = \"a:1\"\n".to_owned());
        // A tiny deterministic PRNG (xorshift) keeps the test reproducible without deps.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let junk = [
            "\"",
            "[",
            "]",
            "=",
            "${",
            "}",
            "\n",
            "[[server.services]]",
            "\u{0}",
            "é",
            "0",
            "\"\"\"",
            "'",
            ".",
            "-1",
            "1e999",
        ];
        let mut cases = 0;
        for seed in &seeds {
            let seed = seed.as_str();
            let lines: Vec<&str> = seed.lines().collect();
            for _ in 0..200 {
                let mut text: String = match next() % 4 {
                    0 => {
                        let mut cut = (next() as usize) % (seed.len() + 1);
                        while !seed.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        seed[..cut].to_owned()
                    }
                    1 => {
                        let mut kept: Vec<&str> =
                            lines.iter().copied().filter(|_| next() % 3 != 0).collect();
                        if !kept.is_empty() {
                            let i = (next() as usize) % kept.len();
                            let j = (next() as usize) % kept.len();
                            kept.swap(i, j);
                        }
                        kept.join("\n")
                    }
                    _ => seed.to_owned(),
                };
                for _ in 0..(next() % 6) {
                    let mut at = (next() as usize) % (text.len() + 1);
                    while !text.is_char_boundary(at) {
                        at -= 1;
                    }
                    text.insert_str(at, junk[(next() as usize) % junk.len()]);
                }
                let _ = Config::from_toml_str_with_env(&text, "fuzz.toml", &example_env);
                let _ = Config::from_toml_str_with_env(
                    &text.replace("CHANGE-ME", "x"),
                    "fuzz.toml",
                    &|_| None,
                );
                cases += 1;
            }
        }
        assert_eq!(cases, 200 * seeds.len());
    }

    #[test]
    fn show_a_report() {
        let text = "[server]\nbind = \"0.0.0.0:7000\"\npsk = \"short-secret\"\nheartbeat_intervall = \"10s\"\n[server.services.web]\nbind = \"0.0.0.0:80800\"\n";
        let errors =
            Config::from_toml_str_with_env(text, "warren.toml", &|_| None).expect_err("invalid");
        let shown = errors.to_string();
        assert!(!shown.contains("short-secret"));
        // Visible with `cargo test -- --nocapture`.
        println!("{shown}");
    }
}
