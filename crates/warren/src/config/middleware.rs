//! The `middleware` list of an HTTP service: the file form ([`FileMiddleware`], one table
//! per step) and the validated form ([`MiddlewareSpec`]) that
//! [`crate::http::middleware::build_chain`] turns into a running chain.
//!
//! ```toml
//! [[server.services.web.middleware]]
//! type = "access_log"                 # first, so it also logs what later steps refuse
//! format = "json"                     # or "combined"; default json
//! # file = "/var/log/warren/web.log"  # default: the process log (target warren::access)
//!
//! [[server.services.web.middleware]]
//! type = "rate_limit"
//! rate = "100/s"                      # also "/m" and "/h"
//! burst = 50                          # default: the rate's count
//! key = "client_ip"                   # or "route", or "header:X-Api-Key"
//! # max_keys = 65536                  # keys remembered at once (see rate_limit)
//!
//! [[server.services.web.middleware]]
//! type = "basic_auth"
//! realm = "staff"                     # default "warren"
//! users = { alice = "$argon2id$v=19$m=19456,t=2,p=1$…", bob = "$2y$05$…" }
//! # strip = true                      # default: the backend does not see the password
//!
//! [[server.services.web.middleware]]
//! type = "bearer_auth"
//! tokens = ["${WEB_API_TOKEN}"]       # at least 16 characters each
//!
//! [[server.services.web.middleware]]
//! type = "ip_allow"                   # or "ip_deny"
//! cidrs = ["10.0.0.0/8", "2001:db8::/32", "192.0.2.7"]
//!
//! [[server.services.web.middleware]]
//! type = "headers"
//! request = { set = { "X-Forwarded-Proto" = "https" }, remove = ["Cookie"] }
//! response = { add = { "Strict-Transport-Security" = "max-age=31536000" } }
//!
//! [[server.services.web.middleware]]
//! type = "redirect_https"             # plain-HTTP requests get 308 to https://
//! # port = 8443                       # default: none (443)
//!
//! [[server.services.web.middleware]]
//! type = "max_body"
//! limit = "10MiB"                     # or a number of bytes; KB/MB/GB, KiB/MiB/GiB
//!
//! [[server.services.web.middleware]]
//! type = "timeout"
//! duration = "30s"                    # the backend's time to answer; then 504
//! ```
//!
//! The file form is one flat table with every key any type takes, so a key of another
//! type is reported in words ("rate_limit does not take `users`") with the keys it does
//! take, and a misspelt key by serde's `deny_unknown_fields` with the list of keys. Values
//! that may be secrets (tokens, password hashes) never appear in messages.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use serde::Deserialize;
use serde::de::{self, Deserializer};

use super::duration::parse_duration;
use super::error::{ConfigError, Report, join_index, join_key};
use super::suggest::did_you_mean;
use super::typed::{MIN_SECRET_LEN, PLACEHOLDER_PREFIX};
use crate::http::forwarded::Cidr;
use crate::http::middleware::access_log::Format;
use crate::http::middleware::basic_auth::{PasswordHash, check_realm};
use crate::http::middleware::bearer_auth::TokenHash;
use crate::http::middleware::headers::{HeaderRules, check_settable};
use crate::http::middleware::rate_limit::{DEFAULT_MAX_KEYS, KeyBy, Rate};

/// The most keys a `rate_limit` may be told to remember.
pub const MAX_RATE_LIMIT_KEYS: usize = 10_000_000;

/// The realm `basic_auth` and `bearer_auth` name when the config gives none.
pub const DEFAULT_REALM: &str = "warren";

/// The middleware types, in the order the docs list them.
pub const TYPES: [&str; 10] = [
    "access_log",
    "ip_allow",
    "ip_deny",
    "rate_limit",
    "basic_auth",
    "bearer_auth",
    "headers",
    "redirect_https",
    "max_body",
    "timeout",
];

/// One `[[server.services.NAME.middleware]]` table, as the file says it. Which keys apply
/// depends on `type`; `parse_chain` reports the others.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileMiddleware {
    /// The middleware: `access_log`, `ip_allow`, `ip_deny`, `rate_limit`, `basic_auth`,
    /// `bearer_auth`, `headers`, `redirect_https`, `max_body` or `timeout`. Required.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// ip_allow, ip_deny: addresses and CIDR ranges. Required, not empty.
    pub cidrs: Option<Vec<String>>,
    /// basic_auth, bearer_auth: the realm named in `WWW-Authenticate`. Default `warren`.
    pub realm: Option<String>,
    /// basic_auth: user name -> argon2 or bcrypt hash. Required, not empty.
    pub users: Option<FileUsers>,
    /// bearer_auth: the accepted tokens. Required, not empty.
    pub tokens: Option<FileTokens>,
    /// basic_auth, bearer_auth: remove `Authorization` before forwarding. Default true.
    pub strip: Option<bool>,
    /// rate_limit: `"100/s"`, `"30/m"`, `"1000/h"`. Required.
    pub rate: Option<String>,
    /// rate_limit: requests allowed at once after a quiet spell. Default: the rate's
    /// count.
    pub burst: Option<i64>,
    /// rate_limit: `"client_ip"` (default), `"route"` or `"header:NAME"`.
    pub key: Option<String>,
    /// rate_limit: keys remembered at once. Default 65536.
    pub max_keys: Option<i64>,
    /// headers: edits of the request.
    pub request: Option<FileHeaderRules>,
    /// headers: edits of the response.
    pub response: Option<FileHeaderRules>,
    /// access_log: `"json"` (default) or `"combined"`.
    pub format: Option<String>,
    /// access_log: a file to append to. Default: the process log.
    pub file: Option<String>,
    /// redirect_https: the HTTPS port to redirect to. Default: none in the URL (443).
    pub port: Option<i64>,
    /// max_body: the largest request body, bytes or `"10MiB"`. Required.
    pub limit: Option<FileSize>,
    /// timeout: the backend's time to answer, `"30s"`. Required.
    pub duration: Option<String>,
}

/// `headers`' edits of one direction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHeaderRules {
    /// Header -> value, replacing every value of the header.
    pub set: Option<BTreeMap<String, String>>,
    /// Header -> value, appended.
    pub add: Option<BTreeMap<String, String>>,
    /// Headers removed.
    pub remove: Option<Vec<String>>,
}

/// `basic_auth`'s users: name -> password hash. Masked in `Debug`; a type error never
/// quotes the value.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct FileUsers(pub BTreeMap<String, String>);

impl fmt::Debug for FileUsers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl<'de> Deserialize<'de> for FileUsers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        BTreeMap::<String, String>::deserialize(deserializer)
            .map(FileUsers)
            .map_err(|_| {
                de::Error::custom(
                    "users must be a table of user = \"hash\", e.g. users = { alice = \"$2y$05$...\" }",
                )
            })
    }
}

/// `bearer_auth`'s tokens. Masked in `Debug`; a type error never quotes the value.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct FileTokens(pub Vec<String>);

impl fmt::Debug for FileTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{} tokens]", self.0.len())
    }
}

impl<'de> Deserialize<'de> for FileTokens {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<String>::deserialize(deserializer)
            .map(FileTokens)
            .map_err(|_| {
                de::Error::custom(
                    "tokens must be a list of strings, e.g. tokens = [\"${WEB_API_TOKEN}\"]",
                )
            })
    }
}

/// A size as the file says it: a number of bytes, or a string with a unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSize {
    /// `limit = 1048576`.
    Bytes(i64),
    /// `limit = "1MiB"`.
    Text(String),
}

impl<'de> Deserialize<'de> for FileSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl de::Visitor<'_> for SizeVisitor {
            type Value = FileSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of bytes or a size such as \"10MiB\"")
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<FileSize, E> {
                Ok(FileSize::Bytes(value))
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<FileSize, E> {
                Ok(FileSize::Bytes(i64::try_from(value).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: de::Error>(self, value: &str) -> Result<FileSize, E> {
                Ok(FileSize::Text(value.to_owned()))
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

/// One validated middleware, ready for [`crate::http::middleware::build_chain`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MiddlewareSpec {
    /// Only these ranges pass (403 for the rest).
    IpAllow(Vec<Cidr>),
    /// These ranges are refused (403).
    IpDeny(Vec<Cidr>),
    /// User name and password, checked against hashes.
    BasicAuth {
        /// Named in `WWW-Authenticate`.
        realm: String,
        /// User name -> hash.
        users: BTreeMap<String, PasswordHash>,
        /// Remove `Authorization` before forwarding.
        strip: bool,
    },
    /// One of a list of bearer tokens.
    BearerAuth {
        /// Named in `WWW-Authenticate`.
        realm: String,
        /// Hashes of the accepted tokens.
        tokens: Vec<TokenHash>,
        /// Remove `Authorization` before forwarding.
        strip: bool,
    },
    /// At most `rate` per key, bursts up to `burst`.
    RateLimit {
        /// Requests per period.
        rate: Rate,
        /// Requests allowed at once.
        burst: NonZeroU32,
        /// What requests are counted by.
        key: KeyBy,
        /// Keys remembered at once.
        max_keys: usize,
    },
    /// Header edits.
    Headers {
        /// Of the request, before forwarding.
        request: HeaderRules,
        /// Of the response, before the visitor sees it.
        response: HeaderRules,
    },
    /// One line per request.
    AccessLog {
        /// JSON or combined.
        format: Format,
        /// Appended to this file; `None`: the process log.
        file: Option<PathBuf>,
    },
    /// Plain-HTTP requests get 308 to HTTPS.
    RedirectHttps {
        /// The HTTPS port in the URL; `None`: the default (443).
        port: Option<u16>,
    },
    /// Request bodies of at most `limit` bytes.
    MaxBody {
        /// Bytes.
        limit: u64,
    },
    /// The backend's time to answer.
    Timeout(Duration),
}

impl MiddlewareSpec {
    /// The `type` of this middleware in a config file.
    pub fn kind(&self) -> &'static str {
        match self {
            MiddlewareSpec::IpAllow(_) => "ip_allow",
            MiddlewareSpec::IpDeny(_) => "ip_deny",
            MiddlewareSpec::BasicAuth { .. } => "basic_auth",
            MiddlewareSpec::BearerAuth { .. } => "bearer_auth",
            MiddlewareSpec::RateLimit { .. } => "rate_limit",
            MiddlewareSpec::Headers { .. } => "headers",
            MiddlewareSpec::AccessLog { .. } => "access_log",
            MiddlewareSpec::RedirectHttps { .. } => "redirect_https",
            MiddlewareSpec::MaxBody { .. } => "max_body",
            MiddlewareSpec::Timeout(_) => "timeout",
        }
    }
}

/// The keys each type takes (besides `type`).
fn keys_of(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "ip_allow" | "ip_deny" => &["cidrs"],
        "basic_auth" => &["realm", "users", "strip"],
        "bearer_auth" => &["realm", "tokens", "strip"],
        "rate_limit" => &["rate", "burst", "key", "max_keys"],
        "headers" => &["request", "response"],
        "access_log" => &["format", "file"],
        "redirect_https" => &["port"],
        "max_body" => &["limit"],
        "timeout" => &["duration"],
        _ => return None,
    })
}

impl FileMiddleware {
    /// The keys this table sets (besides `type`).
    fn present(&self) -> Vec<&'static str> {
        let set = [
            ("cidrs", self.cidrs.is_some()),
            ("realm", self.realm.is_some()),
            ("users", self.users.is_some()),
            ("tokens", self.tokens.is_some()),
            ("strip", self.strip.is_some()),
            ("rate", self.rate.is_some()),
            ("burst", self.burst.is_some()),
            ("key", self.key.is_some()),
            ("max_keys", self.max_keys.is_some()),
            ("request", self.request.is_some()),
            ("response", self.response.is_some()),
            ("format", self.format.is_some()),
            ("file", self.file.is_some()),
            ("port", self.port.is_some()),
            ("limit", self.limit.is_some()),
            ("duration", self.duration.is_some()),
        ];
        set.into_iter()
            .filter_map(|(name, present)| present.then_some(name))
            .collect()
    }
}

/// Validates a service's middleware list; `key` is its path (`server.services.web.middleware`).
/// Every problem goes to `report`, each with the key path of the value at fault; the specs
/// of the tables without problems come back in order.
pub(crate) fn parse_chain(
    report: &mut Report,
    key: &str,
    file: &[FileMiddleware],
) -> Vec<MiddlewareSpec> {
    let mut specs = Vec::with_capacity(file.len());
    for (index, table) in file.iter().enumerate() {
        let path = join_index(key, index);
        let before = report.errors.len();
        if let Some(spec) = parse_one(report, &path, table)
            && report.errors.len() == before
        {
            specs.push(spec);
        }
    }
    specs
}

/// Parses a list of addresses and CIDR ranges at `key` (`cidrs` here; the server's
/// `[server.http] trusted_proxies` too). Each bad entry is reported at `key[i]` with a hint;
/// `None` if any was bad.
pub(crate) fn parse_cidrs(report: &mut Report, key: &str, list: &[String]) -> Option<Vec<Cidr>> {
    let mut ranges = Vec::with_capacity(list.len());
    for (i, text) in list.iter().enumerate() {
        match text.parse::<Cidr>() {
            Ok(range) => ranges.push(range),
            Err(error) => {
                let hint = error.hint();
                report
                    .fail(ConfigError::new(join_index(key, i), error.to_string()).with_hint(hint));
            }
        }
    }
    (ranges.len() == list.len()).then_some(ranges)
}

/// Like `parse_chain`, for builders without a config file: the specs of `file`, or every
/// problem found.
///
/// # Errors
/// [`super::ConfigErrors::Invalid`] listing every problem (without positions).
pub fn parse_chain_checked(
    key: &str,
    file: &[FileMiddleware],
) -> Result<Vec<MiddlewareSpec>, super::ConfigErrors> {
    let mut report = Report::default();
    let specs = parse_chain(&mut report, key, file);
    report.into_result(None).map(|()| specs)
}

fn types_hint() -> String {
    format!("write one of: {}", TYPES.join(", "))
}

fn parse_one(report: &mut Report, path: &str, file: &FileMiddleware) -> Option<MiddlewareSpec> {
    let Some(kind) = file.kind.as_deref().map(str::trim) else {
        report.fail(
            ConfigError::new(path, "this middleware has no `type`")
                .with_hint(format!("add type = \"...\"; {}", types_hint())),
        );
        return None;
    };
    let Some(takes) = keys_of(kind) else {
        let hint = match did_you_mean(kind, &TYPES) {
            Some(close) => format!("did you mean \"{close}\"? {}", types_hint()),
            None => types_hint(),
        };
        report.fail(
            ConfigError::new(
                join_key(path, "type"),
                format!("unknown middleware type `{kind}`"),
            )
            .with_hint(hint),
        );
        return None;
    };
    // Keys of other types are reported, and the keys this type takes are still checked,
    // so one pass reports everything.
    for name in file.present() {
        if !takes.contains(&name) {
            let hint = match did_you_mean(name, takes) {
                Some(close) => {
                    format!("did you mean `{close}`? {kind} takes: {}", takes.join(", "))
                }
                None => format!("remove it; {kind} takes: {}", takes.join(", ")),
            };
            report.fail(
                ConfigError::new(
                    join_key(path, name),
                    format!("{kind} does not take `{name}`"),
                )
                .with_hint(hint),
            );
        }
    }
    let mut cx = Cx { report, path };
    match kind {
        "ip_allow" => cx.cidrs(kind, file).map(MiddlewareSpec::IpAllow),
        "ip_deny" => cx.cidrs(kind, file).map(MiddlewareSpec::IpDeny),
        "basic_auth" => cx.basic_auth(file),
        "bearer_auth" => cx.bearer_auth(file),
        "rate_limit" => cx.rate_limit(file),
        "headers" => cx.headers(file),
        "access_log" => cx.access_log(file),
        "redirect_https" => cx.redirect_https(file),
        "max_body" => cx.max_body(file),
        "timeout" => cx.timeout(file),
        _ => None,
    }
}

/// The report and the table's path, for the per-type checks.
struct Cx<'r> {
    report: &'r mut Report,
    path: &'r str,
}

impl Cx<'_> {
    fn key(&self, name: &str) -> String {
        join_key(self.path, name)
    }

    fn fail(&mut self, key: String, message: impl Into<String>, hint: impl Into<String>) {
        self.report
            .fail(ConfigError::new(key, message).with_hint(hint));
    }

    fn missing(&mut self, kind: &str, name: &str, example: &str) {
        let key = self.path.to_owned();
        self.fail(
            key,
            format!("{kind} needs `{name}`"),
            format!("add {example}"),
        );
    }

    fn cidrs(&mut self, kind: &str, file: &FileMiddleware) -> Option<Vec<Cidr>> {
        let Some(list) = &file.cidrs else {
            self.missing(kind, "cidrs", "cidrs = [\"10.0.0.0/8\", \"2001:db8::/32\"]");
            return None;
        };
        if list.is_empty() {
            let what = if kind == "ip_allow" {
                "an empty ip_allow would refuse every visitor"
            } else {
                "an empty ip_deny does nothing"
            };
            self.fail(
                self.key("cidrs"),
                what,
                "list addresses or ranges, e.g. cidrs = [\"10.0.0.0/8\"], or remove this middleware",
            );
            return None;
        }
        parse_cidrs(self.report, &self.key("cidrs"), list)
    }

    fn realm(&mut self, file: &FileMiddleware) -> String {
        let realm = file
            .realm
            .clone()
            .unwrap_or_else(|| DEFAULT_REALM.to_owned());
        if let Err(problem) = check_realm(&realm) {
            self.fail(
                self.key("realm"),
                format!("the realm {problem}"),
                "use a short plain name, e.g. realm = \"staff\"",
            );
        }
        realm
    }

    fn basic_auth(&mut self, file: &FileMiddleware) -> Option<MiddlewareSpec> {
        let realm = self.realm(file);
        let Some(FileUsers(users)) = &file.users else {
            self.missing(
                "basic_auth",
                "users",
                "users = { alice = \"HASH\" }; make a hash with `htpasswd -nbB alice PASSWORD`",
            );
            return None;
        };
        if users.is_empty() {
            self.fail(
                self.key("users"),
                "basic_auth has no users: nobody could sign in",
                "add users = { alice = \"HASH\" }; make a hash with `htpasswd -nbB alice PASSWORD`",
            );
            return None;
        }
        let mut parsed = BTreeMap::new();
        for (user, hash) in users {
            let key = join_key(&self.key("users"), user);
            if user.is_empty() || user.contains(':') || user.chars().any(char::is_control) {
                self.fail(
                    key,
                    format!("{user:?} cannot be a user name"),
                    "user names are not empty and hold no `:` or control characters (RFC 7617)",
                );
                continue;
            }
            match PasswordHash::parse(hash) {
                Ok(hash) => {
                    parsed.insert(user.clone(), hash);
                }
                // The message never quotes the value: it may be a real password.
                Err(error) => self.fail(
                    key,
                    format!("the password of `{user}` {error}"),
                    error.hint(),
                ),
            }
        }
        (parsed.len() == users.len()).then(|| MiddlewareSpec::BasicAuth {
            realm,
            users: parsed,
            strip: file.strip.unwrap_or(true),
        })
    }

    fn bearer_auth(&mut self, file: &FileMiddleware) -> Option<MiddlewareSpec> {
        let realm = self.realm(file);
        let Some(FileTokens(tokens)) = &file.tokens else {
            self.missing(
                "bearer_auth",
                "tokens",
                "tokens = [\"${WEB_API_TOKEN}\"] (from the environment; `openssl rand -base64 32` makes one)",
            );
            return None;
        };
        if tokens.is_empty() {
            self.fail(
                self.key("tokens"),
                "bearer_auth has no tokens: every request would be refused",
                "add tokens = [\"${WEB_API_TOKEN}\"]",
            );
            return None;
        }
        let mut hashes = Vec::with_capacity(tokens.len());
        for (i, token) in tokens.iter().enumerate() {
            let key = join_index(&self.key("tokens"), i);
            let is_placeholder = token
                .get(..PLACEHOLDER_PREFIX.len())
                .is_some_and(|start| start.eq_ignore_ascii_case(PLACEHOLDER_PREFIX));
            if is_placeholder {
                self.fail(
                    key,
                    "the token still holds the CHANGE-ME placeholder from the example config",
                    "replace it with a random value (`openssl rand -base64 32`), or reference an environment variable: \"${WEB_API_TOKEN}\"",
                );
            } else if token.chars().count() < MIN_SECRET_LEN {
                self.fail(
                    key,
                    format!("the token is shorter than {MIN_SECRET_LEN} characters"),
                    "use a random value of at least 16 characters, e.g. from `openssl rand -base64 32`",
                );
            } else {
                hashes.push(TokenHash::of(token));
            }
        }
        (hashes.len() == tokens.len()).then(|| MiddlewareSpec::BearerAuth {
            realm,
            tokens: hashes,
            strip: file.strip.unwrap_or(true),
        })
    }

    fn rate_limit(&mut self, file: &FileMiddleware) -> Option<MiddlewareSpec> {
        let rate = match &file.rate {
            None => {
                self.missing("rate_limit", "rate", "rate = \"100/s\"");
                None
            }
            Some(text) => match text.parse::<Rate>() {
                Ok(rate) => Some(rate),
                Err(error) => {
                    let hint = error.hint();
                    self.fail(self.key("rate"), error.to_string(), hint);
                    None
                }
            },
        };
        let burst = match file.burst {
            None => rate.map(|rate| rate.count),
            Some(burst) => match u32::try_from(burst).ok().and_then(NonZeroU32::new) {
                Some(burst) => Some(burst),
                None => {
                    self.fail(
                        self.key("burst"),
                        format!("burst {burst} is not a number of requests"),
                        "write a whole number from 1, e.g. burst = 50 (default: the rate's count)",
                    );
                    None
                }
            },
        };
        let key = match file.key.as_deref() {
            None => Some(KeyBy::ClientIp),
            Some(text) => match text.parse::<KeyBy>() {
                Ok(key) => Some(key),
                Err(problem) => {
                    self.fail(
                        self.key("key"),
                        problem,
                        "write \"client_ip\" (the default), \"route\" (one limit for the whole service) or \"header:NAME\"",
                    );
                    None
                }
            },
        };
        let max_keys = match file.max_keys {
            None => Some(DEFAULT_MAX_KEYS),
            Some(max) => match usize::try_from(max) {
                Ok(max) if (1..=MAX_RATE_LIMIT_KEYS).contains(&max) => Some(max),
                _ => {
                    self.fail(
                        self.key("max_keys"),
                        format!("max_keys {max} is out of range"),
                        format!("write 1..={MAX_RATE_LIMIT_KEYS}; the default {DEFAULT_MAX_KEYS} fits most sites"),
                    );
                    None
                }
            },
        };
        Some(MiddlewareSpec::RateLimit {
            rate: rate?,
            burst: burst?,
            key: key?,
            max_keys: max_keys?,
        })
    }

    fn headers(&mut self, file: &FileMiddleware) -> Option<MiddlewareSpec> {
        let before = self.report.errors.len();
        let request = self.header_rules("request", file.request.as_ref());
        let response = self.header_rules("response", file.response.as_ref());
        if self.report.errors.len() != before {
            return None;
        }
        if request.is_empty() && response.is_empty() {
            self.fail(
                self.path.to_owned(),
                "headers has nothing to do",
                "add request = { set = { \"X-Name\" = \"value\" } } or response = { remove = [\"Server\"] }",
            );
            return None;
        }
        Some(MiddlewareSpec::Headers { request, response })
    }

    fn header_rules(&mut self, side: &str, file: Option<&FileHeaderRules>) -> HeaderRules {
        let mut rules = HeaderRules::default();
        let Some(file) = file else {
            return rules;
        };
        let base = self.key(side);
        for name in file.remove.iter().flatten() {
            if let Some(name) = self.header_name(&join_key(&base, "remove"), name) {
                rules.remove.push(name);
            }
        }
        for (which, map) in [("set", &file.set), ("add", &file.add)] {
            let mut seen: Vec<HeaderName> = Vec::new();
            for (name, value) in map.iter().flatten() {
                let key = join_key(&join_key(&base, which), name);
                let Some(header) = self.header_name(&key, name) else {
                    continue;
                };
                if let Err(problem) = check_settable(&header) {
                    self.fail(key, problem, format!("remove {name} from {which}"));
                    continue;
                }
                if seen.contains(&header) {
                    self.fail(
                        key,
                        format!("{name} is listed twice in {which} (header names ignore case)"),
                        "keep one",
                    );
                    continue;
                }
                seen.push(header.clone());
                match HeaderValue::from_str(value) {
                    Ok(value) => match which {
                        "set" => rules.set.push((header, value)),
                        _ => rules.add.push((header, value)),
                    },
                    Err(_) => self.fail(
                        key,
                        format!("the value of {name} cannot be sent in a header"),
                        "header values are printable text on one line",
                    ),
                }
            }
        }
        rules
    }

    fn header_name(&mut self, key: &str, name: &str) -> Option<HeaderName> {
        match HeaderName::from_bytes(name.trim().as_bytes()) {
            Ok(header) => Some(header),
            Err(_) => {
                self.fail(
                    key.to_owned(),
                    format!("{name:?} is not a header name"),
                    "header names are letters, digits and `-`, e.g. \"X-Request-Id\"",
                );
                None
            }
        }
    }

    fn access_log(&mut self, file: &FileMiddleware) -> Option<MiddlewareSpec> {
        let format = match file.format.as_deref().map(str::trim) {
            None | Some("json") => Format::Json,
            Some("combined") => Format::Combined,
            Some(other) => {
                self.fail(
                    self.key("format"),
                    format!("unknown access log format `{other}`"),
                    "write \"json\" (the default) or \"combined\"",
                );
                return None;
            }
        };
        let file_path = match file.file.as_deref() {
            Some("") => {
                self.fail(
                    self.key("file"),
                    "the access log file is empty",
                    "write a path, or remove `file` to log to the process log",
                );
                return None;
            }
            other => other.map(PathBuf::from),
        };
        Some(MiddlewareSpec::AccessLog {
            format,
            file: file_path,
        })
    }

    fn redirect_https(&mut self, file: &FileMiddleware) -> Option<MiddlewareSpec> {
        let port = match file.port {
            None => None,
            Some(port) => match u16::try_from(port) {
                Ok(port) if port > 0 => Some(port),
                _ => {
                    self.fail(
                        self.key("port"),
                        format!("{port} is not a port"),
                        "write 1..=65535, or remove `port` for the default (443)",
                    );
                    return None;
                }
            },
        };
        Some(MiddlewareSpec::RedirectHttps { port })
    }

    fn max_body(&mut self, file: &FileMiddleware) -> Option<MiddlewareSpec> {
        let hint = "write a number of bytes or a size with a unit, e.g. limit = \"10MiB\" (B, KB, MB, GB, KiB, MiB, GiB)";
        let limit = match &file.limit {
            None => {
                self.missing("max_body", "limit", "limit = \"10MiB\"");
                return None;
            }
            Some(FileSize::Bytes(bytes)) => match u64::try_from(*bytes) {
                Ok(bytes) => bytes,
                Err(_) => {
                    self.fail(self.key("limit"), format!("{bytes} is not a size"), hint);
                    return None;
                }
            },
            Some(FileSize::Text(text)) => match parse_size(text) {
                Some(bytes) => bytes,
                None => {
                    self.fail(self.key("limit"), format!("{text:?} is not a size"), hint);
                    return None;
                }
            },
        };
        Some(MiddlewareSpec::MaxBody { limit })
    }

    fn timeout(&mut self, file: &FileMiddleware) -> Option<MiddlewareSpec> {
        let Some(text) = &file.duration else {
            self.missing("timeout", "duration", "duration = \"30s\"");
            return None;
        };
        match parse_duration(text) {
            Ok(duration) if !duration.is_zero() => Some(MiddlewareSpec::Timeout(duration)),
            Ok(_) => {
                self.fail(
                    self.key("duration"),
                    "a zero timeout would fail every request",
                    "write a duration such as \"30s\"",
                );
                None
            }
            Err(error) => {
                let hint = error.hint();
                self.fail(self.key("duration"), error.to_string(), hint);
                None
            }
        }
    }
}

/// `"512"`, `"512B"`, `"10KB"`, `"10MiB"`, `"1.5GB"`… -> bytes (KB = 1000, KiB = 1024).
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit = unit.trim();
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return None,
    };
    if number.is_empty() {
        return None;
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier);
    }
    let fractional: f64 = number.parse().ok()?;
    let bytes = (fractional * multiplier as f64).round();
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::middleware::basic_auth::tests::{argon2_hash, bcrypt_hash};

    const KEY: &str = "server.services.web.middleware";

    #[derive(Deserialize)]
    struct Wrapper {
        middleware: Vec<FileMiddleware>,
    }

    fn file(text: &str) -> Vec<FileMiddleware> {
        toml::from_str::<Wrapper>(text).expect("parses").middleware
    }

    fn parse(text: &str) -> (Vec<MiddlewareSpec>, Vec<ConfigError>) {
        let mut report = Report::default();
        let specs = parse_chain(&mut report, KEY, &file(text));
        (specs, report.errors)
    }

    fn one_error(text: &str) -> ConfigError {
        let (specs, errors) = parse(text);
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert!(specs.is_empty(), "{specs:?}");
        errors.into_iter().next().expect("one")
    }

    #[test]
    fn a_full_chain_parses_in_order() {
        let text = format!(
            r#"
            [[middleware]]
            type = "access_log"
            format = "combined"
            [[middleware]]
            type = "ip_deny"
            cidrs = ["198.51.100.0/24", "2001:db8::/32"]
            [[middleware]]
            type = "rate_limit"
            rate = "100/s"
            burst = 50
            key = "header:X-Api-Key"
            [[middleware]]
            type = "basic_auth"
            realm = "staff"
            users = {{ alice = "{}", bob = "{}" }}
            strip = false
            [[middleware]]
            type = "bearer_auth"
            tokens = ["0123456789abcdef0123"]
            [[middleware]]
            type = "headers"
            request = {{ set = {{ "X-Forwarded-Proto" = "https" }}, remove = ["Cookie"] }}
            response = {{ add = {{ "Strict-Transport-Security" = "max-age=600" }} }}
            [[middleware]]
            type = "redirect_https"
            port = 8443
            [[middleware]]
            type = "max_body"
            limit = "10MiB"
            [[middleware]]
            type = "timeout"
            duration = "30s"
            [[middleware]]
            type = "ip_allow"
            cidrs = ["10.0.0.0/8"]
            "#,
            argon2_hash("a"),
            bcrypt_hash("b"),
        );
        let (specs, errors) = parse(&text);
        assert!(errors.is_empty(), "{errors:#?}");
        let kinds: Vec<&str> = specs.iter().map(MiddlewareSpec::kind).collect();
        assert_eq!(
            kinds,
            [
                "access_log",
                "ip_deny",
                "rate_limit",
                "basic_auth",
                "bearer_auth",
                "headers",
                "redirect_https",
                "max_body",
                "timeout",
                "ip_allow"
            ]
        );
        assert!(matches!(
            &specs[2],
            MiddlewareSpec::RateLimit { burst, max_keys: DEFAULT_MAX_KEYS, .. } if burst.get() == 50
        ));
        assert!(
            matches!(&specs[3], MiddlewareSpec::BasicAuth { strip: false, users, .. } if users.len() == 2)
        );
        assert!(
            matches!(&specs[4], MiddlewareSpec::BearerAuth { strip: true, realm, .. } if realm == DEFAULT_REALM)
        );
        assert_eq!(specs[7], MiddlewareSpec::MaxBody { limit: 10 << 20 });
        assert_eq!(specs[8], MiddlewareSpec::Timeout(Duration::from_secs(30)));
        // Secrets stay out of Debug.
        let shown = format!("{specs:?} {:?}", file(&text));
        assert!(!shown.contains("0123456789abcdef0123"), "{shown}");
        assert!(!shown.contains("$argon2id"), "{shown}");
    }

    #[test]
    fn defaults() {
        let (specs, errors) = parse(
            r#"
            [[middleware]]
            type = "rate_limit"
            rate = "30/m"
            [[middleware]]
            type = "access_log"
            "#,
        );
        assert!(errors.is_empty(), "{errors:#?}");
        assert!(matches!(
            &specs[0],
            MiddlewareSpec::RateLimit { burst, key: KeyBy::ClientIp, .. } if burst.get() == 30
        ));
        assert_eq!(
            specs[1],
            MiddlewareSpec::AccessLog {
                format: Format::Json,
                file: None
            }
        );
    }

    #[test]
    fn unknown_type_suggests_the_close_one() {
        let error = one_error("[[middleware]]\ntype = \"basic_aut\"\n");
        assert_eq!(error.key, format!("{KEY}[0].type"));
        assert_eq!(error.message, "unknown middleware type `basic_aut`");
        let hint = error.hint.expect("hint");
        assert!(hint.contains("did you mean \"basic_auth\"?"), "{hint}");
        assert!(hint.contains("rate_limit"), "{hint}");

        let error = one_error("[[middleware]]\nrate = \"1/s\"\n");
        assert_eq!(error.key, format!("{KEY}[0]"));
        assert!(error.message.contains("no `type`"));
    }

    #[test]
    fn a_key_of_another_type_is_named() {
        let (specs, errors) = parse(
            r#"
            [[middleware]]
            type = "rate_limit"
            rate = "10/s"
            users = { alice = "x" }
            "#,
        );
        assert!(specs.is_empty());
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert_eq!(errors[0].key, format!("{KEY}[0].users"));
        assert_eq!(errors[0].message, "rate_limit does not take `users`");
        assert_eq!(
            errors[0].hint.as_deref(),
            Some("remove it; rate_limit takes: rate, burst, key, max_keys")
        );
        // A misspelt key is serde's to refuse, with the list of keys.
        let error =
            toml::from_str::<Wrapper>("[[middleware]]\ntype = \"timeout\"\nduratoin = \"1s\"\n")
                .err()
                .expect("unknown key refused");
        assert!(
            error.to_string().contains("unknown field `duratoin`"),
            "{error}"
        );
    }

    #[test]
    fn plain_passwords_are_refused_with_how_to_hash() {
        let error = one_error(
            r#"
            [[middleware]]
            type = "basic_auth"
            users = { alice = "hunter2-is-my-password" }
            "#,
        );
        assert_eq!(error.key, format!("{KEY}[0].users.alice"));
        assert_eq!(
            error.message,
            "the password of `alice` is not an argon2 or bcrypt hash (plain passwords are not accepted)"
        );
        assert!(!error.to_string().contains("hunter2"));
        let hint = error.hint.expect("hint");
        assert!(
            hint.contains("htpasswd -nbB") && hint.contains("argon2"),
            "{hint}"
        );

        let error = one_error(
            "[[middleware]]\ntype = \"basic_auth\"\nusers = { alice = \"$1$abc$def\" }\n",
        );
        assert!(error.message.contains("MD5-crypt"), "{}", error.message);
        let error = one_error("[[middleware]]\ntype = \"basic_auth\"\n");
        assert_eq!(error.message, "basic_auth needs `users`");
        let error = toml::from_str::<Wrapper>(
            "[[middleware]]\ntype = \"basic_auth\"\nusers = \"secret-pw\"\n",
        )
        .err()
        .expect("type error");
        // The loader shows serde's message (toml's Display also quotes the source line).
        assert!(!error.message().contains("secret-pw"), "{error}");
        assert!(error.message().contains("users must be a table"), "{error}");
    }

    #[test]
    fn bad_cidrs_are_named_one_by_one() {
        let (_, errors) = parse(
            r#"
            [[middleware]]
            type = "ip_allow"
            cidrs = ["10.0.0.0/8", "10.0.0.1/8", "300.1.1.1", "::/129"]
            "#,
        );
        let keys: Vec<&str> = errors.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                format!("{KEY}[0].cidrs[1]"),
                format!("{KEY}[0].cidrs[2]"),
                format!("{KEY}[0].cidrs[3]")
            ]
        );
        assert!(
            errors[0]
                .hint
                .as_deref()
                .is_some_and(|h| h.contains("write 10.0.0.0/8"))
        );
        assert!(
            errors[1].message.contains("not an IP address"),
            "{}",
            errors[1].message
        );
        let error = one_error("[[middleware]]\ntype = \"ip_allow\"\ncidrs = []\n");
        assert!(error.message.contains("refuse every visitor"));
    }

    #[test]
    fn bad_rates_and_limits() {
        let error = one_error("[[middleware]]\ntype = \"rate_limit\"\nrate = \"100 per second\"\n");
        assert_eq!(error.key, format!("{KEY}[0].rate"));
        assert!(
            error
                .hint
                .as_deref()
                .is_some_and(|h| h.contains("\"100/s\""))
        );
        let error = one_error("[[middleware]]\ntype = \"rate_limit\"\nrate = \"0/s\"\n");
        assert_eq!(error.key, format!("{KEY}[0].rate"));
        let error = one_error("[[middleware]]\ntype = \"rate_limit\"\nrate = \"1/s\"\nburst = 0\n");
        assert_eq!(error.key, format!("{KEY}[0].burst"));
        let error =
            one_error("[[middleware]]\ntype = \"rate_limit\"\nrate = \"1/s\"\nkey = \"cookie\"\n");
        assert_eq!(error.key, format!("{KEY}[0].key"));
        let error =
            one_error("[[middleware]]\ntype = \"rate_limit\"\nrate = \"1/s\"\nmax_keys = 0\n");
        assert_eq!(error.key, format!("{KEY}[0].max_keys"));
        let error = one_error("[[middleware]]\ntype = \"rate_limit\"\n");
        assert_eq!(error.message, "rate_limit needs `rate`");
    }

    #[test]
    fn other_values_are_checked() {
        let cases = [
            (
                "type = \"bearer_auth\"\ntokens = [\"short\"]",
                "tokens[0]",
                "shorter than 16",
            ),
            (
                "type = \"bearer_auth\"\ntokens = [\"CHANGE-ME-0123456789\"]",
                "tokens[0]",
                "CHANGE-ME",
            ),
            ("type = \"bearer_auth\"\ntokens = []", "tokens", "no tokens"),
            (
                "type = \"basic_auth\"\nrealm = \"a\\\"b\"\nusers = { a = \"x\" }",
                "realm",
                "realm",
            ),
            (
                "type = \"headers\"\nrequest = { set = { \"Bad Name\" = \"x\" } }",
                "request.set.\"Bad Name\"",
                "not a header name",
            ),
            (
                "type = \"headers\"\nresponse = { set = { \"X-A\" = \"line\\nbreak\" } }",
                "response.set.X-A",
                "cannot be sent",
            ),
            (
                "type = \"headers\"\nrequest = { set = { \"Content-Length\" = \"5\" } }",
                "request.set.Content-Length",
                "framing",
            ),
            (
                "type = \"headers\"\nrequest = { set = { \"X-A\" = \"1\", \"x-a\" = \"2\" } }",
                "request.set.x-a",
                "twice",
            ),
            ("type = \"headers\"", "", "nothing to do"),
            (
                "type = \"access_log\"\nformat = \"xml\"",
                "format",
                "unknown access log format",
            ),
            (
                "type = \"redirect_https\"\nport = 70000",
                "port",
                "not a port",
            ),
            (
                "type = \"max_body\"\nlimit = \"10 parsecs\"",
                "limit",
                "not a size",
            ),
            ("type = \"max_body\"\nlimit = -1", "limit", "not a size"),
            (
                "type = \"timeout\"\nduration = \"30\"",
                "duration",
                "no unit",
            ),
            ("type = \"timeout\"\nduration = \"0s\"", "duration", "zero"),
            ("type = \"timeout\"", "", "timeout needs `duration`"),
        ];
        for (body, key, message) in cases {
            let (specs, errors) = parse(&format!("[[middleware]]\n{body}\n"));
            assert!(specs.is_empty(), "{body}: {specs:?}");
            let expected_key = if key.is_empty() {
                format!("{KEY}[0]")
            } else {
                format!("{KEY}[0].{key}")
            };
            assert!(
                errors.iter().any(|e| e.key == expected_key
                    && e.message.contains(message)
                    && e.hint.is_some()),
                "{body}: wanted {expected_key}: {message}, got {errors:#?}"
            );
        }
    }

    #[test]
    fn every_problem_in_one_pass() {
        let (specs, errors) = parse(
            r#"
            [[middleware]]
            type = "timeout"
            duration = "5s"
            [[middleware]]
            type = "nope"
            [[middleware]]
            type = "rate_limit"
            rate = "x"
            burst = -4
            format = "json"
            "#,
        );
        assert_eq!(specs, [MiddlewareSpec::Timeout(Duration::from_secs(5))]);
        let keys: Vec<&str> = errors.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                format!("{KEY}[1].type"),
                format!("{KEY}[2].format"),
                format!("{KEY}[2].rate"),
                format!("{KEY}[2].burst"),
            ]
        );
        assert!(parse_chain_checked(KEY, &file("[[middleware]]\ntype = \"nope\"\n")).is_err());
    }

    /// Hashes are full of `$`; `${NAME}` expansion (run on every string of the file)
    /// leaves them alone.
    #[test]
    fn hashes_survive_env_expansion() {
        for hash in [argon2_hash("a"), bcrypt_hash("b")] {
            assert_eq!(super::super::env::expand(&hash, &|_| None).ok(), Some(hash));
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("512B"), Some(512));
        assert_eq!(parse_size("10KB"), Some(10_000));
        assert_eq!(parse_size("10 KiB"), Some(10_240));
        assert_eq!(parse_size("1.5MiB"), Some(1_572_864));
        assert_eq!(parse_size("2gb"), Some(2_000_000_000));
        for bad in [
            "",
            "MiB",
            "1.2.3MB",
            "10 parsecs",
            "-1",
            "99999999999999999999GiB",
        ] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
