//! The config file in force, as the dashboard shows it: the operator's own text (comments
//! and layout kept, so line numbers match their editor) with every secret value replaced by
//! `"********"`.
//!
//! Secrets are found by parsing the file (`toml_edit` keeps each value's position), not by
//! pattern-matching lines: a token inside an inline table or an array is masked as well as
//! one on a line of its own.

use std::ops::Range;

use toml_edit::{Item, Table, Value};

/// What a masked value reads as.
pub const MASK: &str = "\"********\"";

/// Keys whose values are secrets (the last component of a dotted key).
fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    matches!(key.as_str(), "psk" | "token" | "password" | "secret")
        || key.ends_with("_token")
        || key.ends_with("_psk")
        || key.ends_with("_secret")
        || key.ends_with("password")
}

/// Keys whose every value, at any depth, is a secret (`basic_auth`'s `users`: password
/// hashes by user name).
fn holds_secrets(key: &str) -> bool {
    key.eq_ignore_ascii_case("users")
}

/// `text` with every secret value masked; `None` if it does not parse as TOML (the text in
/// force always did).
pub fn mask(text: &str) -> Option<String> {
    let document = toml_edit::Document::parse(text).ok()?;
    let mut spans = Vec::new();
    if let Some(table) = document.as_item().as_table() {
        table_spans(table, false, &mut spans);
    }
    spans.sort_by_key(|span| std::cmp::Reverse(span.start));
    let mut masked = text.to_owned();
    let mut last_start = usize::MAX;
    for span in spans {
        // Nested spans (a secret table inside a secret table) are masked once, outermost.
        if span.end > last_start || span.end > masked.len() {
            continue;
        }
        masked.replace_range(span.clone(), MASK);
        last_start = span.start;
    }
    Some(masked)
}

fn table_spans(table: &Table, secret: bool, spans: &mut Vec<Range<usize>>) {
    for (key, item) in table.iter() {
        item_spans(item, secret || is_secret(key), holds_secrets(key), spans);
    }
}

/// `secret`: mask this item's values; `all`: mask every value beneath it.
fn item_spans(item: &Item, secret: bool, all: bool, spans: &mut Vec<Range<usize>>) {
    match item {
        Item::Value(value) => value_spans(value, secret, all, spans),
        Item::Table(table) => table_spans(table, secret || all, spans),
        Item::ArrayOfTables(tables) => {
            for table in tables.iter() {
                table_spans(table, secret || all, spans);
            }
        }
        Item::None => {}
    }
}

fn value_spans(value: &Value, secret: bool, all: bool, spans: &mut Vec<Range<usize>>) {
    match value {
        Value::InlineTable(table) => {
            for (key, value) in table.iter() {
                value_spans(
                    value,
                    secret || all || is_secret(key),
                    all || holds_secrets(key),
                    spans,
                );
            }
        }
        Value::Array(array) => {
            for value in array.iter() {
                value_spans(value, secret, all, spans);
            }
        }
        leaf if secret || all => spans.extend(leaf.span()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_wherever_they_are_and_the_rest_is_kept() {
        let text = r#"# my server
[server]
bind = "0.0.0.0:2333"
psk = "0123456789abcdef-psk"   # keep this comment
default_token = 'tok-0123456789abcdef'

[server.services.web]
bind = "0.0.0.0:8080"
token = """multi
line"""
tls = { cert = "c.pem", key = "k.pem" }

[server.services.site.middleware.auth]
type = "basic_auth"
users = { alice = "$argon2id$v=19$xyz", bob = "$2y$05$abc" }

[admin]
bind = "127.0.0.1:7001"
token = "admin-0123456789abcdef"
"#;
        let masked = mask(text).unwrap();
        for secret in [
            "0123456789abcdef-psk",
            "tok-0123456789abcdef",
            "multi",
            "$argon2id",
            "$2y$05$abc",
            "admin-0123456789abcdef",
        ] {
            assert!(!masked.contains(secret), "{secret} leaked:\n{masked}");
        }
        for kept in [
            "# keep this comment",
            "k.pem",
            "0.0.0.0:8080",
            "basic_auth",
            "alice",
        ] {
            assert!(masked.contains(kept), "{kept} lost:\n{masked}");
        }
        // Line numbers still match the file's (except inside a masked multi-line string).
        let line = |t: &str, needle: &str| t.lines().position(|l| l.contains(needle));
        assert_eq!(
            line(text, "[admin]"),
            line(&masked, "[admin]").map(|n| n + 1)
        );
    }

    #[test]
    fn text_that_does_not_parse_is_not_shown() {
        assert_eq!(mask("psk = \"unterminated"), None);
    }
}
