//! TOML text -> [`FileConfig`] -> [`Config`], reporting every problem in one pass.
//!
//! How errors are gathered, step by step:
//! 1. `DeTable::parse_recoverable` parses the text into a tree with a byte span on every
//!    key and value. Syntax errors are reported (all of them) and loading stops there:
//!    nothing below would be reliable.
//! 2. Each table is checked against the field list of its file-model struct (read from
//!    serde, see [`super::file`]); every unknown key is reported with a did-you-mean hint
//!    and removed, so serde's `deny_unknown_fields` only guards the model.
//! 3. `${NAME}` is expanded in every string; a failure is reported and the key removed.
//! 4. Each section and each service is deserialized on its own. When serde rejects a
//!    value (a type error), the key it belongs to is reported, removed, and the table
//!    deserialized again, so one bad value hides no other.
//! 5. The file model is converted to typed values field by field and the semantic rules
//!    run ([`super::convert`]); those errors name key paths, which the span index built
//!    in step 1 turns into `line:column` (falling back to the nearest enclosing table).
//!
//! A key whose value was reported is "poisoned" so later steps do not report it again as
//! missing or judge its placeholder.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::de::{DeserializeOwned, IntoDeserializer};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::Config;
use super::convert::convert_config;
use super::env::expand;
use super::error::{
    ConfigError, ConfigErrors, LineIndex, Report, join_index, join_key, parent_path,
};
use super::file::{
    FileAdmin, FileClient, FileClientService, FileConfig, FileServer, FileServerService,
    field_names,
};
use super::suggest::did_you_mean;

/// Keys whose values are secrets: their values never appear in messages.
const SECRET_KEYS: [&str; 3] = ["psk", "default_token", "token"];

/// Loads a config from TOML text; `lookup` resolves `${NAME}`.
pub(crate) fn load_str(
    text: &str,
    source_name: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    let mut loader = Loader {
        lines: LineIndex::new(text),
        report: Report::default(),
        lookup,
        spans: BTreeMap::new(),
    };
    let (document, syntax_errors) = DeTable::parse_recoverable(text);
    if !syntax_errors.is_empty() {
        loader.syntax_errors(syntax_errors);
        return loader.finish(source_name, None);
    }
    let root = document.into_inner();
    index_table(&root, "", &mut loader.spans);
    let file = loader.file_config(root);
    let config = convert_config(file, &mut loader.report);
    loader.finish(source_name, config)
}

struct Loader<'a> {
    lines: LineIndex<'a>,
    report: Report,
    lookup: &'a dyn Fn(&str) -> Option<String>,
    /// Key path -> span of its value (for tables: their header), to place errors that
    /// only know their key.
    spans: BTreeMap<String, Range<usize>>,
}

impl Loader<'_> {
    /// Places every error that has no position yet, then returns the result.
    fn finish(mut self, source_name: &str, config: Option<Config>) -> Result<Config, ConfigErrors> {
        for error in &mut self.report.errors {
            if error.line.is_some() {
                continue;
            }
            let mut path = Some(error.key.as_str());
            while let Some(key) = path {
                if let Some(span) = self.spans.get(key) {
                    let (line, column) = self.lines.position(span.start);
                    error.line = Some(line);
                    error.column = Some(column);
                    break;
                }
                path = parent_path(key);
            }
        }
        self.report.into_result(Some(source_name.to_owned()))?;
        config.ok_or_else(|| ConfigErrors::Invalid {
            source_name: Some(source_name.to_owned()),
            errors: vec![ConfigError::new("", "the config is invalid")],
        })
    }

    /// Records `error` at byte `offset` and poisons its key.
    fn fail_at(&mut self, offset: usize, mut error: ConfigError) {
        let (line, column) = self.lines.position(offset);
        error.line = Some(line);
        error.column = Some(column);
        self.report.fail(error);
    }

    fn syntax_errors(&mut self, errors: Vec<toml::de::Error>) {
        // Recovery can report one problem several times.
        let mut seen = Vec::new();
        for error in errors {
            let span = error.span().unwrap_or(0..0);
            let message = error.message().trim().to_owned();
            if seen.contains(&(span.clone(), message.clone())) {
                continue;
            }
            seen.push((span.clone(), message.clone()));
            self.fail_at(
                span.start,
                ConfigError::new("", format!("TOML syntax error: {message}")).with_hint(
                    "check quotes and brackets: strings are written \"...\", tables [server] or [server.services.NAME]",
                ),
            );
        }
    }

    fn file_config(&mut self, mut root: DeTable<'_>) -> FileConfig {
        self.unknown_keys("", &mut root, field_names::<FileConfig>());
        let server = root.remove("server").and_then(|value| {
            let (section, services) =
                self.table::<FileServer>("server", value, Some("services"))?;
            let services = services.map(|s| self.services::<FileServerService>("server", s));
            Some(FileServer {
                services: services.unwrap_or_default(),
                ..section
            })
        });
        let client = root.remove("client").and_then(|value| {
            let (section, services) =
                self.table::<FileClient>("client", value, Some("services"))?;
            let services = services.map(|s| self.services::<FileClientService>("client", s));
            Some(FileClient {
                services: services.unwrap_or_default(),
                ..section
            })
        });
        let admin = root
            .remove("admin")
            .and_then(|value| self.table::<FileAdmin>("admin", value, None))
            .map(|(admin, _)| admin);
        FileConfig {
            server,
            client,
            admin,
        }
    }

    fn services<S: DeserializeOwned>(
        &mut self,
        side: &str,
        value: Spanned<DeValue<'_>>,
    ) -> BTreeMap<String, S> {
        let path = join_key(side, "services");
        let span = value.span();
        let DeValue::Table(table) = value.into_inner() else {
            self.fail_at(
                span.start,
                ConfigError::new(&path, "`services` must be a table of services")
                    .with_hint(format!("write each service as its own table: [{path}.web]")),
            );
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        for (name, value) in table {
            let name = name.into_inner().into_owned();
            let key = join_key(&path, &name);
            if let Some((service, _)) = self.table::<S>(&key, value, None) {
                out.insert(name, service);
            }
        }
        out
    }

    /// Checks, expands and deserializes one table. `nested` names a sub-table handled
    /// separately (the services), which is returned as is.
    fn table<'i, T: DeserializeOwned>(
        &mut self,
        path: &str,
        mut value: Spanned<DeValue<'i>>,
        nested: Option<&str>,
    ) -> Option<(T, Option<Spanned<DeValue<'i>>>)> {
        let span = value.span();
        let DeValue::Table(table) = value.get_mut() else {
            self.fail_at(
                span.start,
                ConfigError::new(path, format!("`{path}` must be a table")).with_hint(format!(
                    "write [{path}] on a line of its own, followed by its keys"
                )),
            );
            return None;
        };
        let nested_value = nested.and_then(|key| table.remove(key));
        self.unknown_keys(path, table, field_names::<T>());
        self.expand_table(path, table);
        let parsed = self.deserialize::<T>(path, value)?;
        Some((parsed, nested_value))
    }

    /// Reports and removes every key that `fields` does not list.
    fn unknown_keys(&mut self, path: &str, table: &mut DeTable<'_>, fields: &[&str]) {
        let unknown: Vec<(String, usize)> = table
            .iter()
            .filter(|(key, _)| !fields.contains(&key.get_ref().as_ref()))
            .map(|(key, _)| (key.get_ref().to_string(), key.span().start))
            .collect();
        for (key, offset) in unknown {
            table.remove(key.as_str());
            let hint = unknown_key_hint(path, &key, fields);
            self.fail_at(
                offset,
                ConfigError::new(
                    join_key(path, &key),
                    format!("unknown key `{key}` in {}", table_label(path)),
                )
                .with_hint(hint),
            );
        }
    }

    /// Expands `${NAME}` in every string under `table`; a key that fails is removed.
    fn expand_table(&mut self, path: &str, table: &mut DeTable<'_>) {
        let mut failed = Vec::new();
        for (key, value) in table.iter_mut() {
            let key_path = join_key(path, key.get_ref());
            if let Err((error_path, offset, error)) = expand_value(&key_path, value, self.lookup) {
                failed.push((key.get_ref().to_string(), error_path, offset, error));
            }
        }
        for (key, error_path, offset, error) in failed {
            table.remove(key.as_str());
            self.report.poison(&join_key(path, &key));
            let hint = error.hint();
            self.fail_at(
                offset,
                ConfigError::new(error_path, error.to_string()).with_hint(hint),
            );
        }
    }

    /// Deserializes `value`; each value serde rejects is reported and removed, then the
    /// rest is tried again.
    fn deserialize<T: DeserializeOwned>(
        &mut self,
        path: &str,
        mut value: Spanned<DeValue<'_>>,
    ) -> Option<T> {
        loop {
            let error = match T::deserialize(value.clone().into_deserializer()) {
                Ok(parsed) => return Some(parsed),
                Err(error) => error,
            };
            let error_span = error.span().unwrap_or_else(|| value.span());
            let culprit = match value.get_mut() {
                DeValue::Table(table) => table
                    .iter()
                    .find(|(key, value)| {
                        contains(&value.span(), error_span.start)
                            || contains(&key.span(), error_span.start)
                    })
                    .map(|(key, _)| key.get_ref().to_string())
                    .inspect(|key| {
                        table.remove(key.as_str());
                    }),
                _ => None,
            };
            let Some(key) = culprit else {
                // Not attributable to one key: report it on the table and give up on it.
                self.fail_at(
                    error_span.start,
                    ConfigError::new(path, error.message().to_owned()),
                );
                return None;
            };
            let message = if SECRET_KEYS.contains(&key.as_str()) {
                // serde's message may quote the value.
                "must be a string".to_owned()
            } else {
                error.message().to_owned()
            };
            let mut config_error = ConfigError::new(join_key(path, &key), message);
            if let Some(hint) = type_hint(&key) {
                config_error = config_error.with_hint(hint);
            }
            self.fail_at(error_span.start, config_error);
        }
    }
}

fn contains(span: &Range<usize>, offset: usize) -> bool {
    span.start <= offset && offset < span.end.max(span.start + 1)
}

/// Expands strings under `value`; on failure returns the path, offset and cause.
fn expand_value(
    path: &str,
    value: &mut Spanned<DeValue<'_>>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), (String, usize, super::env::EnvError)> {
    let offset = value.span().start;
    match value.get_mut() {
        DeValue::String(text) => {
            let expanded =
                expand(text, lookup).map_err(|error| (path.to_owned(), offset, error))?;
            *text = expanded.into();
        }
        DeValue::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                expand_value(&join_index(path, i), item, lookup)?;
            }
        }
        DeValue::Table(table) => {
            for (key, item) in table.iter_mut() {
                expand_value(&join_key(path, key.get_ref()), item, lookup)?;
            }
        }
        DeValue::Integer(_) | DeValue::Float(_) | DeValue::Boolean(_) | DeValue::Datetime(_) => {}
    }
    Ok(())
}

/// Records the span of every key path under `table`.
fn index_table(table: &DeTable<'_>, path: &str, spans: &mut BTreeMap<String, Range<usize>>) {
    for (key, value) in table.iter() {
        let key_path = join_key(path, key.get_ref());
        index_value(value, key_path, spans);
    }
}

fn index_value(
    value: &Spanned<DeValue<'_>>,
    path: String,
    spans: &mut BTreeMap<String, Range<usize>>,
) {
    match value.get_ref() {
        DeValue::Table(table) => index_table(table, &path, spans),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                index_value(item, join_index(&path, i), spans);
            }
        }
        _ => {}
    }
    let span = value.span();
    // Implicit tables (`services` in `[server.services.web]`) have no text of their own.
    if span.start < span.end {
        spans.insert(path, span);
    }
}

/// `[server]`, `[server.services.web]`, or "the top level".
fn table_label(path: &str) -> String {
    if path.is_empty() {
        "the top level".to_owned()
    } else {
        format!("[{path}]")
    }
}

/// Did-you-mean, else where the key belongs, else the valid keys.
fn unknown_key_hint(path: &str, key: &str, fields: &[&str]) -> String {
    if let Some(close) = did_you_mean(key, fields) {
        return format!("did you mean `{close}`?");
    }
    let schema: [(&str, &[&str]); 6] = [
        ("the top level", field_names::<FileConfig>()),
        ("[server]", field_names::<FileServer>()),
        ("[server.services.NAME]", field_names::<FileServerService>()),
        ("[client]", field_names::<FileClient>()),
        ("[client.services.NAME]", field_names::<FileClientService>()),
        ("[admin]", field_names::<FileAdmin>()),
    ];
    let elsewhere: Vec<&str> = schema
        .iter()
        .filter(|(_, known)| known.contains(&key))
        .map(|(label, _)| *label)
        .collect();
    let valid = fields.join(", ");
    if elsewhere.is_empty() {
        format!("remove it; valid keys in {}: {valid}", table_label(path))
    } else {
        format!(
            "`{key}` belongs in {}; valid keys in {}: {valid}",
            elsewhere.join(" or "),
            table_label(path)
        )
    }
}

/// How to write a value of `key`, for type errors.
fn type_hint(key: &str) -> Option<&'static str> {
    Some(match key {
        "bind" => "write it as a quoted IP:PORT, e.g. bind = \"0.0.0.0:8080\"",
        "server" | "target" => "write it as a quoted HOST:PORT, e.g. \"example.com:7000\"",
        "psk" | "default_token" | "token" => {
            "write it as a quoted string, e.g. \"${WARREN_PSK}\" to read it from the environment"
        }
        "transport" => "write \"noise\" or \"tcp\"",
        "cipher_choice" => "write \"fastest\" or \"ordered\"",
        "tcp_congestion" => "write \"auto\", \"system\" or a kernel name such as \"bbr\"",
        "ciphers" => {
            "write a list of names, e.g. ciphers = [\"aes-256-gcm\", \"chacha20-poly1305\"]"
        }
        "insecure" => "write true or false, without quotes",
        "type" => "write type = \"tcp\" or type = \"udp\"",
        "udp_max_sessions" => "write a whole number without quotes, e.g. udp_max_sessions = 4096",
        "heartbeat_interval"
        | "heartbeat_timeout"
        | "drain_timeout"
        | "drain_grace"
        | "handshake_timeout"
        | "reconnect_initial_delay"
        | "reconnect_max_delay"
        | "udp_idle_timeout" => "write a quoted duration such as \"10s\"",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use warren_proto::{CipherChoice, CipherSuite};

    use super::super::{
        ClientConfig, Config, ConfigErrors, HostPort, P2pEnd, ServerConfig, ServiceKind, Transport,
        has_aes_hardware,
    };
    use crate::crypto::secret::Secret;
    use crate::transport::compress::Codec;

    const PSK: &str = "test-psk-0123456789abcdef";
    const TOKEN: &str = "test-token-0123456789abcdef";

    fn env(name: &str) -> Option<String> {
        match name {
            "WARREN_TEST_PSK" => Some(PSK.to_owned()),
            "WARREN_TEST_TOKEN" => Some(TOKEN.to_owned()),
            _ => None,
        }
    }

    fn load(text: &str) -> Result<Config, ConfigErrors> {
        Config::from_toml_str_with_env(text, "warren.toml", &env)
    }

    fn errors(text: &str) -> ConfigErrors {
        match load(text) {
            Ok(config) => panic!("expected errors, got {config:?}"),
            Err(errors) => errors,
        }
    }

    /// The key of every error, in order.
    fn error_keys(errors: &ConfigErrors) -> Vec<String> {
        keys_and_lines(errors).into_iter().map(|(k, _)| k).collect()
    }

    /// `(key, line)` of every error.
    fn keys_and_lines(errors: &ConfigErrors) -> Vec<(String, Option<usize>)> {
        errors
            .errors()
            .iter()
            .map(|e| (e.key.clone(), e.line))
            .collect()
    }

    fn server(text: &str) -> ServerConfig {
        match load(text) {
            Ok(Config::Server(server)) => server,
            other => panic!("expected a server, got {other:?}"),
        }
    }

    fn client(text: &str) -> ClientConfig {
        match load(text) {
            Ok(Config::Client(client)) => client,
            other => panic!("expected a client, got {other:?}"),
        }
    }

    #[test]
    fn full_server_file() {
        let server = server(
            r#"
[server]
bind = "0.0.0.0:7000"
psk = "${WARREN_TEST_PSK}"
default_token = "${WARREN_TEST_TOKEN}"
transport = "noise"
ciphers = ["aes-256-gcm", "chacha20-poly1305"]
heartbeat_interval = "250ms"
drain_timeout = "45s"
drain_grace = "2s"
handshake_timeout = "1m30s"
insecure = false

[server.services.web]
type = "tcp"
bind = "[::]:8080"
token = "web-token-0123456789"

[server.services."ssh.home"]
bind = "127.0.0.1:2222"
"#,
        );
        assert_eq!(server.bind, "0.0.0.0:7000".parse().expect("addr"));
        assert_eq!(server.psk, Secret::new(PSK));
        assert_eq!(server.default_token, Some(Secret::new(TOKEN)));
        assert_eq!(server.transport, Transport::Noise);
        assert_eq!(
            server.ciphers,
            [CipherSuite::Aes256Gcm, CipherSuite::ChaCha20Poly1305]
        );
        assert_eq!(server.heartbeat_interval, Duration::from_millis(250));
        assert_eq!(server.drain_timeout, Duration::from_secs(45));
        assert_eq!(server.drain_grace, Duration::from_secs(2));
        assert_eq!(server.handshake_timeout, Duration::from_secs(90));
        assert!(!server.insecure);
        let web = &server.services["web"];
        assert_eq!(web.name, "web");
        assert_eq!(web.kind, ServiceKind::Tcp);
        assert_eq!(web.bind, "[::]:8080".parse().expect("addr"));
        assert_eq!(web.token, Secret::new("web-token-0123456789"));
        // Falls back to default_token.
        assert_eq!(server.services["ssh.home"].token, Secret::new(TOKEN));
    }

    #[test]
    fn full_client_file() {
        let client = client(
            r#"
[client]
server = "[2001:db8::1]:7000"
psk = "${WARREN_TEST_PSK}"
transport = "noise"
ciphers = ["chacha20-poly1305"]
heartbeat_timeout = "45s"
drain_timeout = "2m"
reconnect_initial_delay = "500ms"
reconnect_max_delay = "1m"
handshake_timeout = "5s"

[client.services.web]
type = "tcp"
target = "localhost:3000"
token = "${WARREN_TEST_TOKEN}"

[client.services.db]
target = "[::1]:5432"
token = "db-token-0123456789"
"#,
        );
        assert_eq!(
            client.server,
            HostPort {
                host: "2001:db8::1".into(),
                port: 7000
            }
        );
        assert_eq!(client.server.to_string(), "[2001:db8::1]:7000");
        assert_eq!(client.psk, Secret::new(PSK));
        assert_eq!(client.default_token, None);
        assert_eq!(client.ciphers, [CipherSuite::ChaCha20Poly1305]);
        assert_eq!(client.heartbeat_timeout, Duration::from_secs(45));
        assert_eq!(client.drain_timeout, Duration::from_secs(120));
        assert_eq!(client.reconnect_initial_delay, Duration::from_millis(500));
        assert_eq!(client.reconnect_max_delay, Duration::from_secs(60));
        assert_eq!(client.handshake_timeout, Duration::from_secs(5));
        assert_eq!(
            client.services["web"].target,
            HostPort {
                host: "localhost".into(),
                port: 3000
            }
        );
        assert_eq!(client.services["web"].token, Secret::new(TOKEN));
        assert_eq!(client.services["db"].target.to_string(), "[::1]:5432");
    }

    #[test]
    fn defaults_are_applied() {
        let server = server("[server]\nbind = \"[::]:7000\"\npsk = \"${WARREN_TEST_PSK}\"\n");
        let mut expected = ServerConfig::new("[::]:7000".parse().expect("addr"), Secret::new(PSK));
        expected.services.clear();
        assert_eq!(server, expected);
        assert_eq!(
            server.ciphers,
            CipherSuite::default_preference(has_aes_hardware())
        );
        assert_eq!(server.heartbeat_interval, Duration::from_secs(10));
        assert_eq!(server.drain_timeout, Duration::from_secs(30));
        assert_eq!(server.drain_grace, Duration::ZERO);
        assert_eq!(server.handshake_timeout, Duration::from_secs(10));
        assert_eq!(server.transport, Transport::Noise);

        let client =
            client("[client]\nserver = \"example.com:7000\"\npsk = \"${WARREN_TEST_PSK}\"\n");
        assert_eq!(
            client,
            ClientConfig::new("example.com:7000".parse().expect("hp"), Secret::new(PSK))
        );
        assert_eq!(client.heartbeat_timeout, Duration::from_secs(30));
        assert_eq!(client.drain_timeout, Duration::from_secs(30));
        assert_eq!(client.reconnect_initial_delay, Duration::from_secs(1));
        assert_eq!(client.reconnect_max_delay, Duration::from_secs(30));
    }

    #[test]
    fn tcp_congestion_is_auto_unless_set_and_checked_when_set() {
        use crate::transport::congestion::TcpCongestion;
        let psk = "psk = \"${WARREN_TEST_PSK}\"\n";
        let server = server(&format!("[server]\nbind = \"[::]:7000\"\n{psk}"));
        assert_eq!(server.tcp_congestion, TcpCongestion::Auto);
        let client = client(&format!(
            "[client]\nserver = \"a:1\"\n{psk}tcp_congestion = \"cubic\"\n"
        ));
        assert_eq!(client.tcp_congestion, TcpCongestion::Named("cubic".into()));
        let bad = errors(&format!(
            "[server]\nbind = \"[::]:7000\"\n{psk}tcp_congestion = \"BBR!\"\n"
        ));
        assert_eq!(error_keys(&bad), ["server.tcp_congestion"]);
        assert!(bad.to_string().contains("\"system\""), "{bad}");
    }

    #[test]
    fn expands_the_real_environment() {
        // PATH is set in any test environment worth the name; setting a variable would
        // need `unsafe` (std::env::set_var) in edition 2024.
        let Ok(path) = std::env::var("PATH") else {
            return;
        };
        let text =
            "[client]\nserver = \"a:1\"\npsk = \"${PATH}-and-some-padding\"\ninsecure = true\n";
        let Ok(Config::Client(client)) = Config::from_toml_str(text, "t.toml") else {
            panic!("should load");
        };
        assert_eq!(client.psk.expose(), format!("{path}-and-some-padding"));
    }

    #[test]
    fn missing_environment_variable() {
        let errors =
            errors("[server]\nbind = \"0.0.0.0:7000\"\npsk = \"${WARREN_TEST_UNSET_1234}\"\n");
        assert_eq!(
            keys_and_lines(&errors),
            [("server.psk".to_owned(), Some(3))]
        );
        let text = errors.to_string();
        assert!(text.contains("WARREN_TEST_UNSET_1234 is not set"), "{text}");
        assert!(text.contains("hint: set WARREN_TEST_UNSET_1234"), "{text}");
        // Not also reported as a missing psk.
        assert!(!text.contains("missing pre-shared key"), "{text}");
    }

    #[test]
    fn escaped_dollar_is_literal() {
        let server =
            server("[server]\nbind = \"0.0.0.0:7000\"\npsk = \"$${NOT_A_VAR}-long-enough-psk\"\n");
        assert_eq!(server.psk.expose(), "${NOT_A_VAR}-long-enough-psk");
    }

    #[test]
    fn refuses_weak_secrets() {
        let missing = errors("[server]\nbind = \"0.0.0.0:7000\"\n");
        assert_eq!(
            keys_and_lines(&missing),
            [("server.psk".to_owned(), Some(1))]
        );
        assert!(missing.to_string().contains("missing pre-shared key"));

        let short = errors("[server]\nbind = \"0.0.0.0:7000\"\npsk = \"short-secret\"\n");
        assert_eq!(keys_and_lines(&short), [("server.psk".to_owned(), Some(3))]);
        let text = short.to_string();
        assert!(text.contains("shorter than 16"), "{text}");
        assert!(!text.contains("short-secret"), "secret leaked: {text}");
        assert!(
            !format!("{short:?}").contains("short-secret"),
            "secret leaked in Debug"
        );

        let placeholder = errors(
            "[client]\nserver = \"a:1\"\npsk = \"change-me-please-0123456789\"\ndefault_token = \"CHANGE-ME-token-0123456789\"\n[client.services.web]\ntarget = \"a:2\"\n",
        );
        assert_eq!(
            keys_and_lines(&placeholder),
            [
                ("client.psk".to_owned(), Some(3)),
                ("client.default_token".to_owned(), Some(4))
            ]
        );
        assert!(placeholder.to_string().contains("CHANGE-ME placeholder"));

        let token = errors(
            "[server]\nbind = \"0.0.0.0:7000\"\npsk = \"${WARREN_TEST_PSK}\"\n[server.services.web]\nbind = \"0.0.0.0:80\"\ntoken = \"tiny\"\n",
        );
        assert_eq!(
            keys_and_lines(&token),
            [("server.services.web.token".to_owned(), Some(6))]
        );
        assert!(!token.to_string().contains("tiny"));
    }

    #[test]
    fn secret_of_wrong_type_is_not_echoed() {
        let errors = errors("[server]\nbind = \"0.0.0.0:7000\"\npsk = 12345678901234567890\n");
        assert_eq!(
            keys_and_lines(&errors),
            [("server.psk".to_owned(), Some(3))]
        );
        assert!(!errors.to_string().contains("1234567890"), "{errors}");
    }

    #[test]
    fn insecure_allows_what_it_should() {
        let server = server(
            "[server]\nbind = \"0.0.0.0:7000\"\ninsecure = true\ntransport = \"tcp\"\nciphers = [\"none\"]\ndefault_token = \"x\"\n[server.services.a]\nbind = \"0.0.0.0:81\"\ntoken = \"CHANGE-ME\"\n[server.services.b]\nbind = \"0.0.0.0:82\"\n",
        );
        assert!(server.psk.is_empty());
        assert_eq!(server.transport, Transport::Tcp);
        assert_eq!(server.ciphers, [CipherSuite::None]);
    }

    #[test]
    fn transports_list_both_sides() {
        let client = client(
            "[client]\nserver = \"a.example:7000\"\npsk = \"${WARREN_TEST_PSK}\"\ntransports = [\"quic\", \"noise\", \"wss:443\"]\ntransport_retry = \"5s\"\n[client.quic]\n[client.ws]\npath = \"/t\"\n",
        );
        assert_eq!(client.transport, Transport::Quic);
        let listed: Vec<String> = client
            .transport_list()
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(listed, ["quic", "noise", "wss:443"]);
        assert_eq!(client.transport_retry, Duration::from_secs(5));
        assert_eq!(client.ws.path, "/t");

        let listening = server(
            "[server]\nbind = \"0.0.0.0:7000\"\npsk = \"${WARREN_TEST_PSK}\"\ntransports = [\"quic\", \"noise\", \"wss:443\"]\n",
        );
        assert_eq!(listening.quic_bind(), Some("0.0.0.0:7000".parse().unwrap()));
        assert_eq!(
            listening.tcp_binds(),
            [
                "0.0.0.0:7000".parse().unwrap(),
                "0.0.0.0:443".parse().unwrap()
            ]
        );
        // A single transport is a list of one on the configured port.
        let plain = server("[server]\nbind = \"0.0.0.0:7000\"\npsk = \"${WARREN_TEST_PSK}\"\n");
        assert_eq!(plain.transport_list().len(), 1);
        assert_eq!(plain.quic_bind(), None);
    }

    #[test]
    fn transports_list_mistakes_are_named() {
        let head = "[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\n";
        let both = errors(&format!(
            "{head}transport = \"noise\"\ntransports = [\"quic\"]\n"
        ));
        assert_eq!(error_keys(&both), ["client.transports"]);
        assert!(both.to_string().contains("remove transport"), "{both}");
        let typo = errors(&format!("{head}transports = [\"quic\", \"wsss:443\"]\n"));
        assert_eq!(error_keys(&typo), ["client.transports[1]"]);
        assert!(typo.to_string().contains("did you mean \"wss\""), "{typo}");
        let port = errors(&format!("{head}transports = [\"wss:https\"]\n"));
        assert!(port.to_string().contains("NAME:PORT"), "{port}");
        let twice = errors(&format!(
            "{head}transports = [\"noise\", \"quic\", \"noise:8000\"]\n"
        ));
        assert!(
            twice.to_string().contains("\"noise\" is listed twice"),
            "{twice}"
        );
        let empty = errors(&format!("{head}transports = []\n"));
        assert_eq!(error_keys(&empty), ["client.transports"]);
        // Tables of transports the list does not name.
        let quic = errors(&format!(
            "{head}transports = [\"noise\", \"wss\"]\n[client.quic]\n"
        ));
        assert!(
            quic.to_string().contains("no transport is \"quic\""),
            "{quic}"
        );
        let proxied = errors(&format!(
            "{head}transports = [\"quic\", \"wss\"]\nproxy = \"http://127.0.0.1:3128\"\n"
        ));
        assert_eq!(error_keys(&proxied), ["client.proxy"]);
        // A server transport on a service's port.
        let clash = errors(
            "[server]\nbind = \"0.0.0.0:7000\"\npsk = \"${WARREN_TEST_PSK}\"\ntransports = [\"noise\", \"wss:8080\"]\ndefault_token = \"${WARREN_TEST_PSK}\"\n[server.services.web]\nbind = \"0.0.0.0:8080\"\n",
        );
        assert!(clash.to_string().contains("server.transports"), "{clash}");
    }

    #[test]
    fn refuses_plaintext_without_insecure() {
        let errors = errors(
            "[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\ntransport = \"tcp\"\nciphers = [\"aes-128-gcm\", \"none\"]\n",
        );
        assert_eq!(
            keys_and_lines(&errors),
            [
                ("client.transport".to_owned(), Some(4)),
                ("client.ciphers[1]".to_owned(), Some(5))
            ]
        );
        let text = errors.to_string();
        assert!(text.contains("warren.toml:4:13: client.transport: transport \"tcp\" sends everything in plaintext"), "{text}");
        assert!(text.contains("insecure = true"), "{text}");
    }

    #[test]
    fn cipher_list_rules() {
        let empty =
            errors("[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\nciphers = []\n");
        assert_eq!(
            keys_and_lines(&empty),
            [("client.ciphers".to_owned(), Some(4))]
        );
        let unknown = errors(
            "[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\nciphers = [\"aes-256-gcm\", \"aes256gcm\", \"rot13\"]\n",
        );
        assert_eq!(
            keys_and_lines(&unknown),
            [
                ("client.ciphers[1]".to_owned(), Some(4)),
                ("client.ciphers[2]".to_owned(), Some(4))
            ]
        );
        let text = unknown.to_string();
        assert!(
            text.contains("expected one of: aes-256-gcm, aes-128-gcm, chacha20-poly1305"),
            "{text}"
        );
        assert!(text.contains("did you mean \"aes-256-gcm\"?"), "{text}");
    }

    #[test]
    fn cipher_choice_and_the_newer_suite() {
        let ordered = client(
            "[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\nciphers = [\"aegis-128x2\", \"aegis-128l\"]\ncipher_choice = \"ordered\"\n",
        );
        assert_eq!(ordered.cipher_choice, CipherChoice::Ordered);
        assert_eq!(
            ordered.ciphers,
            [CipherSuite::Aegis128X2, CipherSuite::Aegis128L]
        );
        let default = client("[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\n");
        assert_eq!(default.cipher_choice, CipherChoice::Fastest, "the default");
        let wrong = errors(
            "[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\ncipher_choice = \"quickest\"\n",
        );
        assert_eq!(
            keys_and_lines(&wrong),
            [("client.cipher_choice".to_owned(), Some(4))]
        );
        let text = wrong.to_string();
        assert!(text.contains("`fastest` or `ordered`"), "{text}");
        let typed = errors(
            "[server]\nbind = \"0.0.0.0:7000\"\npsk = \"${WARREN_TEST_PSK}\"\ncipher_choice = 1\n",
        );
        assert!(
            typed
                .to_string()
                .contains("write \"fastest\" or \"ordered\""),
            "{typed}"
        );
    }

    #[test]
    fn every_error_at_once_with_lines() {
        let text = r#"[server]
bind = "0.0.0.0:7000"
psk = "${WARREN_TEST_PSK}"
heartbeat_intervall = "10s"
handshake_timeout = "ten seconds"

[server.services.web]
bind = "0.0.0.0:80800"
token = "${WARREN_TEST_TOKEN}"
"#;
        let errors = errors(text);
        assert_eq!(
            keys_and_lines(&errors),
            [
                ("server.heartbeat_intervall".to_owned(), Some(4)),
                ("server.handshake_timeout".to_owned(), Some(5)),
                ("server.services.web.bind".to_owned(), Some(8)),
            ]
        );
        let shown = errors.to_string();
        assert!(shown.contains("warren.toml:4:1: server.heartbeat_intervall: unknown key `heartbeat_intervall` in [server]\n  hint: did you mean `heartbeat_interval`?"), "{shown}");
        assert!(shown.contains("warren.toml:8:8: server.services.web.bind: invalid socket address \"0.0.0.0:80800\": invalid port `80800`\n  hint: write it as IP:PORT"), "{shown}");
    }

    #[test]
    fn admin_section_on_both_sides() {
        let base = "[server]\nbind = \"0.0.0.0:7000\"\npsk = \"${WARREN_TEST_PSK}\"\n";
        let config = server(&format!("{base}[admin]\nbind = \"127.0.0.1:7001\"\n"));
        let admin = config.admin.expect("admin configured");
        assert_eq!(admin.bind, "127.0.0.1:7001".parse().unwrap());
        assert!(admin.token.is_none());
        assert!(server(base).admin.is_none());
        let client = client(
            "[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\n[admin]\nbind = \"[::1]:7001\"\ntoken = \"${WARREN_TEST_TOKEN}\"\n",
        );
        assert_eq!(
            client
                .admin
                .and_then(|a| a.token)
                .map(|t| t.expose().to_owned()),
            Some(TOKEN.to_owned())
        );
    }

    #[test]
    fn admin_rules_are_reported_with_the_rest() {
        // A public bind without a token, a weak token, a missing bind and an unknown key,
        // together with a [server] error: all at once.
        let all = errors(
            "[server]\nbind = \"0.0.0.0:7000\"\npsk = \"short\"\n[admin]\nbind = \"0.0.0.0:7001\"\ntokn = \"x\"\n",
        );
        let text = all.to_string();
        assert_eq!(
            keys_and_lines(&all),
            [
                ("server.psk".to_owned(), Some(3)),
                ("admin.bind".to_owned(), Some(5)),
                ("admin.tokn".to_owned(), Some(6)),
            ],
            "{text}"
        );
        assert!(text.contains("needs a token"), "{text}");
        assert!(text.contains("did you mean `token`?"), "{text}");
        let weak = errors(
            "[server]\nbind = \"0.0.0.0:7000\"\npsk = \"${WARREN_TEST_PSK}\"\n[admin]\nbind = \"0.0.0.0:7001\"\ntoken = \"abc\"\n",
        );
        assert_eq!(keys_and_lines(&weak), [("admin.token".to_owned(), Some(6))]);
        assert!(!weak.to_string().contains("abc"));
        let missing =
            errors("[server]\nbind = \"0.0.0.0:7000\"\npsk = \"${WARREN_TEST_PSK}\"\n[admin]\n");
        assert_eq!(keys_and_lines(&missing)[0].0, "admin.bind");
    }

    #[test]
    fn unknown_keys_in_every_section() {
        let errors = errors(
            "colour = 1\n[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\nheartbeat_interval = \"5s\"\nbogus = true\n[client.services.web]\ntarget = \"a:2\"\ntoken = \"${WARREN_TEST_TOKEN}\"\nallow_ports = \"1-2\"\n",
        );
        assert_eq!(
            keys_and_lines(&errors),
            [
                ("colour".to_owned(), Some(1)),
                ("client.heartbeat_interval".to_owned(), Some(5)),
                ("client.bogus".to_owned(), Some(6)),
                ("client.services.web.allow_ports".to_owned(), Some(10)),
            ]
        );
        let text = errors.to_string();
        assert!(
            text.contains("`heartbeat_interval` belongs in [server]"),
            "{text}"
        );
        assert!(text.contains("`allow_ports` belongs in [server]"), "{text}");
        assert!(
            text.contains("valid keys in [client]: server, servers, psk"),
            "{text}"
        );
    }

    #[test]
    fn every_type_error_in_one_section() {
        let errors = errors(
            "[server]\nbind = 7000\npsk = \"${WARREN_TEST_PSK}\"\ninsecure = \"no\"\nheartbeat_interval = 10\n",
        );
        assert_eq!(
            keys_and_lines(&errors),
            [
                ("server.bind".to_owned(), Some(2)),
                ("server.insecure".to_owned(), Some(4)),
                ("server.heartbeat_interval".to_owned(), Some(5)),
            ]
        );
        let text = errors.to_string();
        assert!(
            text.contains("write heartbeat_interval = \"10s\""),
            "{text}"
        );
        assert!(text.contains("write true or false"), "{text}");
        // `bind` is reported as a bad value, not also as missing.
        assert!(!text.contains("missing `bind`"), "{text}");
    }

    #[test]
    fn service_rules() {
        let errors = errors(
            r#"[server]
bind = "0.0.0.0:7000"
psk = "${WARREN_TEST_PSK}"
[server.services.a]
bind = "0.0.0.0:8080"
token = "${WARREN_TEST_TOKEN}"
[server.services.b]
bind = "127.0.0.1:8080"
token = "${WARREN_TEST_TOKEN}"
[server.services."bad name!"]
bind = "0.0.0.0:8081"
token = "${WARREN_TEST_TOKEN}"
[server.services.notoken]
bind = "0.0.0.0:8082"
[server.services.http]
type = "http"
bind = "0.0.0.0:8083"
token = "${WARREN_TEST_TOKEN}"
[server.services.named]
bind = "localhost:8084"
token = "${WARREN_TEST_TOKEN}"
"#,
        );
        assert_eq!(
            keys_and_lines(&errors),
            [
                ("server.services.b.bind".to_owned(), Some(8)),
                ("server.services.\"bad name!\"".to_owned(), Some(10)),
                ("server.services.notoken.token".to_owned(), Some(13)),
                // An http service has no `bind`, and needs [server.http].
                ("server.services.http".to_owned(), Some(15)),
                ("server.services.http.bind".to_owned(), Some(17)),
                ("server.services.named.bind".to_owned(), Some(20)),
            ]
        );
        let text = errors.to_string();
        assert!(
            text.contains("127.0.0.1:8080 is already used by server.services.a.bind"),
            "{text}"
        );
        assert!(
            text.contains("service `notoken` has no token and [server] has no default_token"),
            "{text}"
        );
        assert!(
            text.contains("an http service needs the server's shared HTTP port"),
            "{text}"
        );
        assert!(text.contains("the host must be an IP address"), "{text}");
        let long = format!(
            "[client]\nserver = \"a:1\"\npsk = \"${{WARREN_TEST_PSK}}\"\n[client.services.{}]\ntarget = \"a:2\"\ntoken = \"${{WARREN_TEST_TOKEN}}\"\n",
            "x".repeat(65)
        );
        assert!(super::super::Config::from_toml_str_with_env(&long, "t", &env).is_err());
    }

    #[test]
    fn udp_services_and_their_keys() {
        let config = Config::from_toml_str_with_env(
            r#"[server]
bind = "0.0.0.0:7000"
psk = "${WARREN_TEST_PSK}"
default_token = "${WARREN_TEST_TOKEN}"
[server.services.dns]
type = "udp"
bind = "0.0.0.0:5353"
udp_idle_timeout = "500ms"
udp_max_sessions = 16
[server.services.dns-tcp]
bind = "0.0.0.0:5353"
[server.services.game]
type = "udp"
bind = "0.0.0.0:27015"
"#,
            "t",
            &env,
        )
        .expect("valid");
        let Config::Server(server) = config else {
            panic!("server config");
        };
        assert_eq!(
            server.services["dns"].kind,
            ServiceKind::Udp(crate::config::UdpSettings {
                idle_timeout: Duration::from_millis(500),
                max_sessions: 16,
            })
        );
        assert_eq!(
            server.services["game"].kind,
            ServiceKind::Udp(crate::config::UdpSettings::DEFAULT)
        );
        assert_eq!(server.services["dns-tcp"].kind, ServiceKind::Tcp);

        let errors = errors(
            r#"[client]
server = "a:1"
psk = "${WARREN_TEST_PSK}"
default_token = "${WARREN_TEST_TOKEN}"
[client.services.web]
target = "a:2"
udp_idle_timeout = "5s"
[client.services.dns]
type = "udp"
target = "a:53"
udp_idle_timeout = 5
udp_max_sessions = -1
[client.services.big]
type = "udp"
target = "a:54"
udp_max_sessions = 100000000
udp_idle_timeout = "0s"
[client.services.typo]
type = "upd"
target = "a:55"
udp_max_sessions = 1
"#,
        );
        assert_eq!(
            keys_and_lines(&errors),
            [
                ("client.services.web.udp_idle_timeout".to_owned(), Some(7)),
                ("client.services.dns.udp_idle_timeout".to_owned(), Some(11)),
                ("client.services.dns.udp_max_sessions".to_owned(), Some(12)),
                ("client.services.big.udp_max_sessions".to_owned(), Some(16)),
                ("client.services.big.udp_idle_timeout".to_owned(), Some(17)),
                ("client.services.typo.type".to_owned(), Some(19)),
            ]
        );
        let text = errors.to_string();
        assert!(
            text.contains("`udp_idle_timeout` only applies to udp services"),
            "{text}"
        );
        assert!(text.contains("set type = \"udp\""), "{text}");
        assert!(text.contains("expected one of: tcp, udp"), "{text}");
        assert!(text.contains("must be at least 1, not -1"), "{text}");
        assert!(text.contains("must be from 1 to 1048576"), "{text}");
    }

    #[test]
    fn duration_rules() {
        let errors = errors(
            "[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\nheartbeat_timeout = \"0s\"\nreconnect_initial_delay = \"1m\"\nreconnect_max_delay = \"30s\"\nhandshake_timeout = \"10\"\n",
        );
        assert_eq!(
            keys_and_lines(&errors),
            [
                ("client.heartbeat_timeout".to_owned(), Some(4)),
                ("client.reconnect_max_delay".to_owned(), Some(6)),
                ("client.handshake_timeout".to_owned(), Some(7)),
            ]
        );
        let text = errors.to_string();
        assert!(
            text.contains("reconnect_max_delay (30s) is shorter than reconnect_initial_delay (1m)"),
            "{text}"
        );
        assert!(text.contains("add a unit: \"10s\""), "{text}");
        // A broken initial delay does not drag the max delay into the report.
        let errors = errors_of(
            "[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\nreconnect_initial_delay = \"x\"\nreconnect_max_delay = \"100ms\"\n",
        );
        assert_eq!(
            keys_and_lines(&errors),
            [("client.reconnect_initial_delay".to_owned(), Some(4))]
        );
    }

    fn errors_of(text: &str) -> ConfigErrors {
        errors(text)
    }

    #[test]
    fn bandwidth_limits_are_rates_in_bytes_per_second_on_every_kind_of_service() {
        let head = "[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\ndefault_token = \"${WARREN_TEST_TOKEN}\"\n";
        let config = client(&format!(
            "{head}[client.services.web]\ntarget = \"127.0.0.1:80\"\nbandwidth_limit = \"10MB/s\"\n\
             [client.services.db]\nbind = \"127.0.0.1:5432\"\nbandwidth_limit = \"512KiB\"\n\
             [client.services.ssh]\ntarget = \"127.0.0.1:22\"\np2p = true\nbandwidth_limit = \"1.5 MB/s\"\n\
             [client.services.free]\ntarget = \"127.0.0.1:81\"\n"
        ));
        assert_eq!(config.services["web"].bandwidth_limit, Some(10_000_000));
        assert_eq!(config.forwards["db"].bandwidth_limit, Some(512 * 1024));
        assert_eq!(config.p2p["ssh"].bandwidth_limit, Some(1_500_000));
        assert_eq!(config.services["free"].bandwidth_limit, None);
        let refused = errors(&format!(
            "{head}[client.services.a]\ntarget = \"127.0.0.1:80\"\nbandwidth_limit = \"0\"\n\
             [client.services.b]\ntarget = \"127.0.0.1:80\"\nbandwidth_limit = \"80Mbps\"\n\
             [client.services.c]\ntarget = \"127.0.0.1:80\"\nbandwidth_limit = \"fast\"\n"
        ));
        let keys = error_keys(&refused);
        assert_eq!(
            keys,
            [
                "client.services.a.bandwidth_limit",
                "client.services.b.bandwidth_limit",
                "client.services.c.bandwidth_limit",
            ]
        );
        let server_head = "[server]\nbind = \"0.0.0.0:7000\"\npsk = \"${WARREN_TEST_PSK}\"\ndefault_token = \"${WARREN_TEST_TOKEN}\"\n";
        let config = server(&format!(
            "{server_head}[server.services.web]\nbind = \"0.0.0.0:8080\"\nbandwidth_limit = \"2MB/s\"\n\
             [server.services.lan]\ntarget = \"10.0.0.5:80\"\nbandwidth_limit = \"1MB\"\n"
        ));
        assert_eq!(config.services["web"].bandwidth_limit, Some(2_000_000));
        assert_eq!(config.forwards["lan"].bandwidth_limit, Some(1_000_000));
        // The server's http services are shaped by their middleware.
        let refused = errors(&format!(
            "{server_head}[server.http]\nbind = \"0.0.0.0:80\"\n[server.services.site]\ntype = \"http\"\nhosts = [\"a.example.com\"]\nbandwidth_limit = \"1MB/s\"\n"
        ));
        assert_eq!(
            keys_and_lines(&refused)[0].0,
            "server.services.site.bandwidth_limit"
        );
    }

    #[test]
    fn compression_is_a_codec_for_tcp_services_on_a_record_transport() {
        let head = "[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\ndefault_token = \"${WARREN_TEST_TOKEN}\"\n";
        let config = client(&format!(
            "{head}[client.services.logs]\ntarget = \"127.0.0.1:80\"\ncompression = \"zstd\"\n\
             [client.services.db]\nbind = \"127.0.0.1:5432\"\ncompression = \"LZ4\"\n"
        ));
        assert_eq!(config.services["logs"].compression, Some(Codec::Zstd));
        assert_eq!(config.forwards["db"].compression, Some(Codec::Lz4));
        let refused = errors(&format!(
            "{head}[client.services.a]\ntarget = \"127.0.0.1:80\"\ncompression = \"gzip\"\n\
             [client.services.b]\ntype = \"udp\"\ntarget = \"127.0.0.1:53\"\ncompression = \"lz4\"\n\
             [client.services.c]\ntarget = \"127.0.0.1:22\"\np2p = true\ncompression = \"lz4\"\n"
        ));
        let keys = error_keys(&refused);
        assert_eq!(
            keys,
            [
                "client.services.a.compression",
                "client.services.b.compression",
                "client.services.c.compression",
            ]
        );
        // QUIC streams carry bytes, not records.
        let refused = errors(&format!(
            "{head}transport = \"quic\"\n[client.services.a]\ntarget = \"127.0.0.1:80\"\ncompression = \"lz4\"\n"
        ));
        assert_eq!(
            keys_and_lines(&refused)[0].0,
            "client.services.a.compression"
        );
    }

    #[test]
    fn p2p_services_have_one_end_and_no_server_tunnel_keys() {
        let head = "[client]\nserver = \"a:1\"\npsk = \"${WARREN_TEST_PSK}\"\ndefault_token = \"${WARREN_TEST_TOKEN}\"\n";
        let config = client(&format!(
            "{head}[client.services.ssh]\ntarget = \"127.0.0.1:22\"\np2p = true\n[client.services.dns]\ntype = \"udp\"\nbind = \"127.0.0.1:5353\"\np2p = true\n"
        ));
        assert!(config.services.is_empty() && config.forwards.is_empty());
        assert_eq!(config.p2p.len(), 2);
        assert!(matches!(config.p2p["ssh"].end, P2pEnd::Exit { .. }));
        assert!(matches!(config.p2p["dns"].kind, ServiceKind::Udp(_)));
        assert_eq!(
            config.p2p["dns"].end,
            P2pEnd::Entrance {
                bind: "127.0.0.1:5353".parse().unwrap()
            }
        );
        // Both ends, neither, http, the keys of server tunnels, a port a forward has.
        let errors = errors(&format!(
            "{head}[client.services.a]\ntarget = \"127.0.0.1:22\"\nbind = \"127.0.0.1:2222\"\np2p = true\n\
             [client.services.b]\np2p = true\n\
             [client.services.c]\ntype = \"http\"\ntarget = \"127.0.0.1:80\"\np2p = true\n\
             [client.services.d]\ntarget = \"127.0.0.1:22\"\nweight = 2\np2p = true\n\
             [client.services.e]\nbind = \"127.0.0.1:6000\"\n\
             [client.services.f]\nbind = \"127.0.0.1:6000\"\np2p = true\n"
        ));
        let keys = error_keys(&errors);
        assert_eq!(
            keys,
            [
                "client.services.a",
                "client.services.b.target",
                "client.services.c.type",
                "client.services.d.weight",
                "client.services.f.bind",
            ],
            "{errors}"
        );
        let text = errors.to_string();
        assert!(text.contains("not both"), "{text}");
        assert!(
            text.contains("already used by client.services.e.bind"),
            "{text}"
        );
    }

    #[test]
    fn addresses_and_ipv6() {
        let server = server("[server]\nbind = \"[::1]:7000\"\npsk = \"${WARREN_TEST_PSK}\"\n");
        assert_eq!(server.bind, "[::1]:7000".parse().expect("addr"));
        let client =
            client("[client]\nserver = \"192.0.2.7:7000\"\npsk = \"${WARREN_TEST_PSK}\"\n");
        assert_eq!(client.server.host, "192.0.2.7");
        let errors = errors(
            "[client]\nserver = \"::1:7000\"\npsk = \"${WARREN_TEST_PSK}\"\n[client.services.a]\ntarget = \"example.com\"\ntoken = \"${WARREN_TEST_TOKEN}\"\n[client.services.b]\ntarget = \"example.com:0\"\ntoken = \"${WARREN_TEST_TOKEN}\"\n",
        );
        assert_eq!(
            keys_and_lines(&errors),
            [
                ("client.server".to_owned(), Some(2)),
                ("client.services.a.target".to_owned(), Some(5)),
                ("client.services.b.target".to_owned(), Some(8)),
            ]
        );
        let text = errors.to_string();
        assert!(text.contains("put IPv6 addresses in brackets"), "{text}");
        assert!(
            text.contains("add the port: \"example.com:7000\""),
            "{text}"
        );
        let errors = errors_of("[server]\nbind = \"0.0.0.0:0\"\npsk = \"${WARREN_TEST_PSK}\"\n");
        assert_eq!(
            keys_and_lines(&errors),
            [("server.bind".to_owned(), Some(2))]
        );
    }

    #[test]
    fn exactly_one_section() {
        let both = errors(
            "[server]\nbind = \"0.0.0.0:7000\"\npsk = \"${WARREN_TEST_PSK}\"\n[client]\nserver = \"a:1\"\npsk = \"short\"\n",
        );
        assert_eq!(
            keys_and_lines(&both),
            [
                ("client".to_owned(), Some(4)),
                ("client.psk".to_owned(), Some(6))
            ]
        );
        assert!(
            both.to_string()
                .contains("put each section in its own file")
        );
        let neither = errors("# nothing here\n");
        assert_eq!(keys_and_lines(&neither), [(String::new(), None)]);
        assert!(
            neither
                .to_string()
                .starts_with("warren.toml: the file has neither"),
            "{neither}"
        );
        let typo = errors("[sever]\nbind = \"0.0.0.0:7000\"\n");
        assert!(
            typo.to_string().contains("did you mean `server`?"),
            "{typo}"
        );
        let not_table = errors("server = \"x\"\n");
        assert_eq!(keys_and_lines(&not_table), [("server".to_owned(), Some(1))]);
    }

    #[test]
    fn syntax_errors_have_positions() {
        let errors = errors("[server]\nbind = \"0.0.0.0:7000\npsk = 1\n");
        let first = &errors.errors()[0];
        assert_eq!(first.line, Some(2));
        assert!(first.message.starts_with("TOML syntax error"), "{errors}");
    }

    #[test]
    fn wrong_side_and_unreadable_file() {
        let text = "[client]\nserver = \"a:1\"\npsk = \"0123456789abcdef0123\"\n";
        let error = ServerConfig::from_toml_str(text, "c.toml").expect_err("a client file");
        assert!(
            error.to_string().contains("expected a [server] config"),
            "{error}"
        );
        assert!(ClientConfig::from_toml_str(text, "c.toml").is_ok());
        let path = std::path::Path::new("/nonexistent/warren-test/warren.toml");
        let error = Config::load(path).expect_err("no such file");
        let shown = error.to_string();
        assert!(
            shown.contains("cannot read config file /nonexistent/warren-test/warren.toml"),
            "{shown}"
        );
        assert!(shown.contains("hint: check the path"), "{shown}");
        assert!(matches!(error, ConfigErrors::Read { .. }));

        // Something endless is refused after a bounded read, not read into memory.
        let error = Config::load(std::path::Path::new("/dev/zero")).expect_err("not a config");
        let shown = error.to_string();
        assert!(shown.contains("larger than 1024 KiB"), "{shown}");
        assert!(shown.contains("hint: a config is a few KiB"), "{shown}");
    }
}
