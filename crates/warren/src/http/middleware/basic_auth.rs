//! `basic_auth`: a user name and password (RFC 7617) in front of a service, checked
//! against argon2 or bcrypt hashes, never plain passwords.
//!
//! # Cost
//!
//! Verifying a hash takes tens of milliseconds of CPU by design. So:
//! * A verification runs on tokio's blocking pool, never on a runtime thread, and at most
//!   [`MAX_CONCURRENT_VERIFICATIONS`] run at once in the whole process. Up to
//!   [`MAX_WAITING_VERIFICATIONS`] more wait for a slot, each at most [`VERIFY_WAIT`];
//!   past either bound the visitor gets 429 with `Retry-After: 1` instead of a growing
//!   queue. (A browser that just logged in sends a few requests at once before the cache
//!   holds its password, so a short wait serves it better than an immediate 429.)
//! * A successful (user, password) pair is remembered as a keyed BLAKE3 tag (key random per
//!   chain, so the tags are worthless outside this process) and later requests compare
//!   tags in constant time instead of paying for the hash again. The cache holds at most
//!   one tag per user and [`MAX_CACHED_USERS`] users, and is emptied when full.
//!
//! Failed attempts are not throttled here: put a `rate_limit` before `basic_auth` to slow
//! down password guessing. User names are not treated as secrets: an unknown user is
//! refused at once, without hashing (so guesses at user names cost the server nothing).
//!
//! # Headers
//!
//! Only `Authorization` is read (never `Proxy-Authorization`, which belongs to proxies
//! on the visitor's side). With `strip = true` (the default) it is removed before the
//! request is forwarded: the password is Warren's, and a backend that logs headers would
//! otherwise keep it. Set `strip = false` when the backend checks the same credentials.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use http::header::{AUTHORIZATION, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{Request, Response, StatusCode};
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use super::{BoxFuture, Flow, Middleware, RequestContext};
use crate::http::Body;
use crate::http::page::error_page;

/// Hash verifications running at once in the process (each holds a blocking thread and
/// tens of milliseconds of CPU).
pub const MAX_CONCURRENT_VERIFICATIONS: usize = 4;

/// Requests waiting for a verification slot before the next one is answered 429.
pub const MAX_WAITING_VERIFICATIONS: usize = 64;

/// The longest a request waits for a verification slot before it is answered 429.
pub const VERIFY_WAIT: Duration = Duration::from_secs(5);

/// Users whose last good password is remembered; the cache is emptied when it is full.
pub const MAX_CACHED_USERS: usize = 1024;

/// The longest `Authorization` header decoded; longer ones are refused unread.
const MAX_AUTHORIZATION_LEN: usize = 4096;

/// The costliest argon2 memory parameter accepted (KiB): 256 MiB. Each running
/// verification holds that much; OWASP's recommendations are below 64 MiB.
pub const MAX_ARGON2_MEMORY_KIB: u32 = 256 * 1024;

/// The costliest argon2 time parameter (passes) accepted.
pub const MAX_ARGON2_PASSES: u32 = 64;

/// The costliest bcrypt cost accepted (2^16 rounds, about four seconds on a laptop).
pub const MAX_BCRYPT_COST: u32 = 16;

/// Slots for hash verifications, shared by every `basic_auth` of the process so that many
/// services cannot together take every blocking thread.
static VERIFIERS: Semaphore = Semaphore::const_new(MAX_CONCURRENT_VERIFICATIONS);

/// Requests waiting for a slot of [`VERIFIERS`].
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// A password hash from the config: an argon2 PHC string (`$argon2id$v=19$m=…`) or a bcrypt
/// hash (`$2b$`, `$2y$`, `$2a$`), validated when the config loads.
#[derive(Clone, PartialEq, Eq)]
pub enum PasswordHash {
    /// An argon2 (id, i or d) PHC string.
    Argon2(String),
    /// A bcrypt hash, as `htpasswd -B` writes it.
    Bcrypt(String),
}

/// Why a configured password hash was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HashError {
    /// Not a hash at all: most likely a plain password.
    #[error("is not an argon2 or bcrypt hash (plain passwords are not accepted)")]
    NotAHash,
    /// Looks like a hash of a kind we do not verify (`$1$`, `$6$`, `{SHA}`).
    #[error("is a {0} hash; only argon2 and bcrypt hashes are accepted")]
    Unsupported(&'static str),
    /// Looks like argon2 or bcrypt but does not parse.
    #[error("is a malformed {kind} hash ({problem})")]
    Malformed {
        /// `argon2` or `bcrypt`.
        kind: &'static str,
        /// What the parser said.
        problem: String,
    },
    /// Parses, but would cost too much to verify on every login.
    #[error("is a {kind} hash with a cost above what Warren verifies ({problem})")]
    TooCostly {
        /// `argon2` or `bcrypt`.
        kind: &'static str,
        /// Which parameter, and its bound.
        problem: String,
    },
}

impl HashError {
    /// How to make a hash Warren takes, for the config error's hint.
    pub fn hint(&self) -> &'static str {
        "make one with `htpasswd -nbB USER PASSWORD` (bcrypt; copy the part after `USER:`) or `printf %s PASSWORD | argon2 SALT -id -e` (argon2id)"
    }
}

impl PasswordHash {
    /// Recognizes and checks a hash from the config. The text is never echoed in errors: a
    /// value that is not a hash may be someone's real password.
    ///
    /// # Errors
    /// [`HashError`] for plain passwords, other hash kinds, malformed or overly costly
    /// hashes.
    pub fn parse(text: &str) -> Result<PasswordHash, HashError> {
        let text = text.trim();
        if text.starts_with("$argon2") {
            let malformed = |problem: String| HashError::Malformed {
                kind: "argon2",
                problem,
            };
            let parsed =
                argon2::PasswordHash::new(text).map_err(|error| malformed(error.to_string()))?;
            let algorithm = parsed.algorithm.as_str();
            if ![
                argon2::ARGON2ID_IDENT,
                argon2::ARGON2I_IDENT,
                argon2::ARGON2D_IDENT,
            ]
            .iter()
            .any(|ident| ident.as_str() == algorithm)
            {
                return Err(malformed(format!("unknown variant {algorithm}")));
            }
            if parsed.salt.is_none() || parsed.hash.is_none() {
                return Err(malformed("no salt or no hash".to_owned()));
            }
            let params =
                argon2::Params::try_from(&parsed).map_err(|error| malformed(error.to_string()))?;
            if params.m_cost() > MAX_ARGON2_MEMORY_KIB {
                return Err(HashError::TooCostly {
                    kind: "argon2",
                    problem: format!("m={} KiB, at most {MAX_ARGON2_MEMORY_KIB}", params.m_cost()),
                });
            }
            if params.t_cost() > MAX_ARGON2_PASSES {
                return Err(HashError::TooCostly {
                    kind: "argon2",
                    problem: format!("t={}, at most {MAX_ARGON2_PASSES}", params.t_cost()),
                });
            }
            return Ok(PasswordHash::Argon2(text.to_owned()));
        }
        if ["$2a$", "$2b$", "$2x$", "$2y$"]
            .iter()
            .any(|prefix| text.starts_with(prefix))
        {
            let parts: bcrypt::HashParts =
                text.parse()
                    .map_err(|error: bcrypt::BcryptError| HashError::Malformed {
                        kind: "bcrypt",
                        problem: error.to_string(),
                    })?;
            if parts.get_cost() > MAX_BCRYPT_COST {
                return Err(HashError::TooCostly {
                    kind: "bcrypt",
                    problem: format!("cost {}, at most {MAX_BCRYPT_COST}", parts.get_cost()),
                });
            }
            return Ok(PasswordHash::Bcrypt(text.to_owned()));
        }
        for (prefix, kind) in [
            ("$apr1$", "Apache MD5"),
            ("$1$", "MD5-crypt"),
            ("$5$", "SHA-256-crypt"),
            ("$6$", "SHA-512-crypt"),
            ("$y$", "yescrypt"),
            ("$scrypt$", "scrypt"),
            ("$pbkdf2", "PBKDF2"),
            ("{SHA}", "SHA-1"),
        ] {
            if text.starts_with(prefix) {
                return Err(HashError::Unsupported(kind));
            }
        }
        Err(HashError::NotAHash)
    }

    /// Whether `password` matches. Slow on purpose: call it on a blocking thread.
    pub fn verify(&self, password: &[u8]) -> bool {
        match self {
            PasswordHash::Argon2(text) => {
                use argon2::PasswordVerifier;
                // Parsed when the config loaded; parsing again is cheap next to hashing.
                argon2::PasswordHash::new(text).is_ok_and(|parsed| {
                    argon2::Argon2::default()
                        .verify_password(password, &parsed)
                        .is_ok()
                })
            }
            PasswordHash::Bcrypt(text) => bcrypt::verify(password, text).unwrap_or(false),
        }
    }

    /// `argon2` or `bcrypt`.
    pub fn kind(&self) -> &'static str {
        match self {
            PasswordHash::Argon2(_) => "argon2",
            PasswordHash::Bcrypt(_) => "bcrypt",
        }
    }
}

impl fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(****)", self.kind())
    }
}

/// Checks that `realm` can be sent in a `WWW-Authenticate` quoted string: printable
/// ASCII without `"` or `\`, at most 128 characters.
///
/// # Errors
/// A sentence saying what is wrong.
pub fn check_realm(realm: &str) -> Result<(), String> {
    if realm.len() > 128 {
        return Err("is longer than 128 characters".to_owned());
    }
    if realm.is_empty() {
        return Err("is empty".to_owned());
    }
    if !realm
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        return Err("may only hold printable ASCII without `\"` and `\\`".to_owned());
    }
    Ok(())
}

/// The `basic_auth` middleware.
pub struct BasicAuth {
    /// The `WWW-Authenticate` value of every 401.
    challenge: HeaderValue,
    users: HashMap<String, PasswordHash>,
    strip: bool,
    cache: Cache,
}

impl BasicAuth {
    /// A `basic_auth` for `users` (name -> hash) in `realm`; `strip` removes the
    /// `Authorization` header before forwarding.
    ///
    /// # Errors
    /// The realm cannot be sent in a header (see [`check_realm`]).
    pub fn new(
        realm: &str,
        users: BTreeMap<String, PasswordHash>,
        strip: bool,
    ) -> Result<BasicAuth, String> {
        check_realm(realm).map_err(|problem| format!("realm {problem}"))?;
        let challenge =
            HeaderValue::from_str(&format!("Basic realm=\"{realm}\", charset=\"UTF-8\""))
                .map_err(|_| "realm cannot be sent in a header".to_owned())?;
        Ok(BasicAuth {
            challenge,
            users: users.into_iter().collect(),
            strip,
            cache: Cache::new(),
        })
    }

    fn unauthorized(&self, cx: &mut RequestContext, outcome: String) -> Flow {
        cx.decide("basic_auth", outcome);
        let mut response = error_page(
            StatusCode::UNAUTHORIZED,
            "Sign in required",
            &format!(
                "{} needs a user name and password. If your browser did not ask for them, reload the page; if you have none, ask the site's operator.",
                cx.host
            ),
        );
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, self.challenge.clone());
        Flow::Respond(response)
    }

    async fn check(&self, request: &mut Request<Body>, cx: &mut RequestContext) -> Flow {
        let Some((user, password)) = credentials(request) else {
            let outcome = if request.headers().contains_key(AUTHORIZATION) {
                "refused: malformed credentials"
            } else {
                "refused: no credentials"
            };
            return self.unauthorized(cx, outcome.to_owned());
        };
        let shown_user: String = user.chars().take(64).collect();
        let Some(hash) = self.users.get(&user) else {
            return self.unauthorized(cx, format!("refused: unknown user {shown_user:?}"));
        };
        let tag = self.cache.tag(&user, &password);
        let good = if self.cache.holds(&user, &tag) {
            true
        } else {
            match verify_slowly(hash.clone(), password).await {
                Verified::Yes => {
                    self.cache.remember(&user, tag);
                    true
                }
                Verified::No => false,
                Verified::Busy => {
                    cx.decide("basic_auth", "busy: too many logins being checked");
                    return Flow::Respond(busy(&cx.host));
                }
            }
        };
        if !good {
            return self.unauthorized(cx, format!("refused: bad password for {shown_user:?}"));
        }
        if self.strip {
            request.headers_mut().remove(AUTHORIZATION);
        }
        cx.decide("basic_auth", format!("user {shown_user:?}"));
        Flow::Continue
    }
}

impl Middleware for BasicAuth {
    fn name(&self) -> &str {
        "basic_auth"
    }

    fn on_request<'a>(
        &'a self,
        request: &'a mut Request<Body>,
        cx: &'a mut RequestContext,
    ) -> BoxFuture<'a, Flow> {
        Box::pin(self.check(request, cx))
    }
}

impl fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BasicAuth")
            .field("users", &self.users.len())
            .field("strip", &self.strip)
            .finish_non_exhaustive()
    }
}

/// The user and password of a `Basic` `Authorization` header, if well formed.
fn credentials(request: &Request<Body>) -> Option<(String, Vec<u8>)> {
    let value = request.headers().get(AUTHORIZATION)?;
    let bytes = value.as_bytes();
    if bytes.len() > MAX_AUTHORIZATION_LEN {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?.trim();
    let (scheme, encoded) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    let password = decoded[colon + 1..].to_vec();
    Some((user, password))
}

/// The outcome of a slow verification.
enum Verified {
    Yes,
    No,
    /// No verification slot within the bounds.
    Busy,
}

/// Verifies on the blocking pool, within the process-wide bounds.
async fn verify_slowly(hash: PasswordHash, password: Vec<u8>) -> Verified {
    let permit = match VERIFIERS.try_acquire() {
        Ok(permit) => permit,
        Err(_) => {
            // Count ourselves among the waiters, or give up if there are too many.
            if WAITING.fetch_add(1, Ordering::AcqRel) >= MAX_WAITING_VERIFICATIONS {
                WAITING.fetch_sub(1, Ordering::AcqRel);
                return Verified::Busy;
            }
            let waited = tokio::time::timeout(VERIFY_WAIT, VERIFIERS.acquire()).await;
            WAITING.fetch_sub(1, Ordering::AcqRel);
            match waited {
                Ok(Ok(permit)) => permit,
                // Timed out, or the semaphore closed (it never is).
                _ => return Verified::Busy,
            }
        }
    };
    // The permit moves into the blocking task: if this request is dropped meanwhile, the
    // slot stays taken until the hashing really ends, so the bound holds.
    let verified = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        hash.verify(&password)
    })
    .await;
    match verified {
        Ok(true) => Verified::Yes,
        Ok(false) => Verified::No,
        Err(error) => {
            tracing::error!(event = "password_verify_failed", %error, "password verification task failed");
            Verified::No
        }
    }
}

/// 429 for a login that found no verification slot.
fn busy(host: &str) -> Response<Body> {
    let mut response = error_page(
        StatusCode::TOO_MANY_REQUESTS,
        "Too many sign-ins",
        &format!("{host} is checking too many passwords right now. Try again in a moment."),
    );
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// Remembered good passwords: per user, the keyed tag of the last one that verified.
struct Cache {
    /// BLAKE3 key of the tags, random per chain.
    key: [u8; 32],
    tags: Mutex<HashMap<String, [u8; 32]>>,
}

impl Cache {
    fn new() -> Cache {
        Cache {
            key: rand::random(),
            tags: Mutex::new(HashMap::new()),
        }
    }

    /// The tag of (`user`, `password`); the user's length goes first so that no two pairs
    /// share an input.
    fn tag(&self, user: &str, password: &[u8]) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new_keyed(&self.key);
        hasher.update(&(user.len() as u64).to_le_bytes());
        hasher.update(user.as_bytes());
        hasher.update(password);
        *hasher.finalize().as_bytes()
    }

    /// Whether `tag` is `user`'s remembered one (compared in constant time).
    fn holds(&self, user: &str, tag: &[u8; 32]) -> bool {
        // A poisoned lock only means another request panicked mid-insert; the map is
        // still a valid map.
        let tags = self
            .tags
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        tags.get(user)
            .is_some_and(|stored| bool::from(stored.ct_eq(tag)))
    }

    fn remember(&self, user: &str, tag: [u8; 32]) {
        let mut tags = self
            .tags
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if tags.len() >= MAX_CACHED_USERS && !tags.contains_key(user) {
            tags.clear();
        }
        tags.insert(user.to_owned(), tag);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.tags.lock().map(|tags| tags.len()).unwrap_or(0)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use argon2::password_hash::{PasswordHasher, SaltString};

    use super::*;
    use crate::http::middleware::testing::{context, get, run};

    /// An argon2id hash of `password` with tiny (test-only) parameters.
    pub(crate) fn argon2_hash(password: &str) -> String {
        let params = argon2::Params::new(64, 1, 1, None).expect("valid params");
        let hasher =
            argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let salt = SaltString::encode_b64(b"warren-test-salt").expect("valid salt");
        hasher
            .hash_password(password.as_bytes(), &salt)
            .expect("hashes")
            .to_string()
    }

    /// A bcrypt hash of `password` at the lowest cost.
    pub(crate) fn bcrypt_hash(password: &str) -> String {
        bcrypt::hash_with_salt(password, 4, *b"warren-test-salt")
            .expect("hashes")
            .format_for_version(bcrypt::Version::TwoY)
    }

    fn with_auth(user: &str, password: &str) -> Request<Body> {
        let mut request = get("/");
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        request.headers_mut().insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Basic {encoded}")).expect("ascii"),
        );
        request
    }

    fn auth(strip: bool) -> BasicAuth {
        let users = BTreeMap::from([
            (
                "alice".to_owned(),
                PasswordHash::parse(&argon2_hash("wonderland")).expect("argon2 parses"),
            ),
            (
                "bob".to_owned(),
                PasswordHash::parse(&bcrypt_hash("builder")).expect("bcrypt parses"),
            ),
        ]);
        BasicAuth::new("staff", users, strip).expect("valid realm")
    }

    #[test]
    fn recognizes_hashes_and_refuses_the_rest() {
        assert!(matches!(
            PasswordHash::parse(&argon2_hash("x")),
            Ok(PasswordHash::Argon2(_))
        ));
        let bcrypt = bcrypt_hash("x");
        assert!(bcrypt.starts_with("$2y$04$"));
        assert!(matches!(
            PasswordHash::parse(&bcrypt),
            Ok(PasswordHash::Bcrypt(_))
        ));
        assert_eq!(PasswordHash::parse("hunter2"), Err(HashError::NotAHash));
        assert_eq!(
            PasswordHash::parse("$apr1$abc$def"),
            Err(HashError::Unsupported("Apache MD5"))
        );
        assert!(matches!(
            PasswordHash::parse("$argon2id$v=19$m=nope"),
            Err(HashError::Malformed { kind: "argon2", .. })
        ));
        assert!(matches!(
            PasswordHash::parse("$2b$04$tooshort"),
            Err(HashError::Malformed { kind: "bcrypt", .. })
        ));
        let costly = bcrypt.replacen("$04$", "$31$", 1);
        assert!(matches!(
            PasswordHash::parse(&costly),
            Err(HashError::TooCostly { kind: "bcrypt", .. })
        ));
        // Debug never shows the hash.
        let shown = format!("{:?}", PasswordHash::parse(&bcrypt).expect("parses"));
        assert_eq!(shown, "bcrypt(****)");
        assert!(HashError::NotAHash.hint().contains("htpasswd -nbB"));
    }

    #[tokio::test]
    async fn argon2_and_bcrypt_users_get_in_with_the_right_password() {
        let auth = auth(true);
        for (user, password) in [("alice", "wonderland"), ("bob", "builder")] {
            let mut request = with_auth(user, password);
            let mut cx = context();
            assert!(run(&auth, &mut request, &mut cx).await.is_none(), "{user}");
            assert!(
                !request.headers().contains_key(AUTHORIZATION),
                "stripped before forwarding"
            );
            assert_eq!(
                cx.decisions,
                [("basic_auth".into(), format!("user {user:?}"))]
            );
        }
    }

    #[tokio::test]
    async fn wrong_missing_or_malformed_credentials_get_401() {
        let auth = auth(true);
        let cases = [
            (
                with_auth("alice", "wrong"),
                "refused: bad password for \"alice\"",
            ),
            (
                with_auth("bob", "wonderland"),
                "refused: bad password for \"bob\"",
            ),
            (
                with_auth("mallory", "x"),
                "refused: unknown user \"mallory\"",
            ),
            (get("/"), "refused: no credentials"),
        ];
        for (mut request, outcome) in cases {
            let mut cx = context();
            let response = run(&auth, &mut request, &mut cx).await.expect("refused");
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
            assert_eq!(
                response.headers()[WWW_AUTHENTICATE],
                "Basic realm=\"staff\", charset=\"UTF-8\""
            );
            assert_eq!(cx.decisions, [("basic_auth".into(), outcome.to_owned())]);
        }
        for header in ["Basic !!!", "Bearer abc", "Basic", "Basic bm9jb2xvbg=="] {
            let mut request = get("/");
            request
                .headers_mut()
                .insert(AUTHORIZATION, HeaderValue::from_static(header));
            let mut cx = context();
            let response = run(&auth, &mut request, &mut cx).await.expect("refused");
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{header}");
        }
        // Proxy-Authorization is not ours.
        let mut request = get("/");
        let encoded = base64::engine::general_purpose::STANDARD.encode("alice:wonderland");
        request.headers_mut().insert(
            http::header::PROXY_AUTHORIZATION,
            HeaderValue::from_str(&format!("Basic {encoded}")).expect("ascii"),
        );
        let response = run(&auth, &mut request, &mut context()).await;
        assert!(response.is_some(), "Proxy-Authorization was accepted");
    }

    #[tokio::test]
    async fn a_good_password_is_cached_and_a_wrong_one_is_not() {
        let auth = auth(false);
        assert_eq!(auth.cache.len(), 0);
        let mut request = with_auth("alice", "wonderland");
        assert!(run(&auth, &mut request, &mut context()).await.is_none());
        assert!(
            request.headers().contains_key(AUTHORIZATION),
            "strip = false keeps it"
        );
        assert_eq!(auth.cache.len(), 1);
        let tag = auth.cache.tag("alice", b"wonderland");
        assert!(auth.cache.holds("alice", &tag));
        assert!(
            !auth
                .cache
                .holds("alice", &auth.cache.tag("alice", b"wonderlanD"))
        );
        assert!(!auth.cache.holds("bob", &tag));

        // The cache hit path: no slot is needed, so it works with every slot taken.
        let all_slots = VERIFIERS
            .acquire_many(MAX_CONCURRENT_VERIFICATIONS as u32)
            .await
            .expect("open");
        let mut request = with_auth("alice", "wonderland");
        assert!(run(&auth, &mut request, &mut context()).await.is_none());
        drop(all_slots);

        let mut request = with_auth("alice", "not-it");
        assert!(run(&auth, &mut request, &mut context()).await.is_some());
        assert_eq!(auth.cache.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn no_slot_within_the_wait_answers_429() {
        let auth = auth(true);
        let all_slots = VERIFIERS
            .acquire_many(MAX_CONCURRENT_VERIFICATIONS as u32)
            .await
            .expect("open");
        let mut cx = context();
        // Time is paused: the wait for a slot runs out at once.
        let response = run(&auth, &mut with_auth("alice", "wonderland"), &mut cx)
            .await
            .expect("answered");
        drop(all_slots);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[RETRY_AFTER], "1");
        assert_eq!(cx.decisions[0].1, "busy: too many logins being checked");
    }

    #[test]
    fn the_cache_stays_bounded() {
        let cache = Cache::new();
        for i in 0..MAX_CACHED_USERS + 10 {
            let user = format!("user{i}");
            let tag = cache.tag(&user, b"pw");
            cache.remember(&user, tag);
            assert!(cache.len() <= MAX_CACHED_USERS);
        }
        // Tags depend on the key: another cache's tags differ.
        assert_ne!(Cache::new().tag("a", b"b"), cache.tag("a", b"b"));
        // And on where the user ends: ("ab", "c") is not ("a", "bc").
        assert_ne!(cache.tag("ab", b"c"), cache.tag("a", b"bc"));
    }

    #[test]
    fn realms_must_fit_a_header() {
        assert!(check_realm("staff area").is_ok());
        assert!(check_realm("").is_err());
        assert!(check_realm("say \"hi\"").is_err());
        assert!(check_realm("line\nbreak").is_err());
        assert!(check_realm("é").is_err());
        assert!(BasicAuth::new("bad\"realm", BTreeMap::new(), true).is_err());
    }
}
