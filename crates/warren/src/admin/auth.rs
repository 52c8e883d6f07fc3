//! Who may use the admin listener, and from which page: the bearer token for scripts, a
//! login cookie for the dashboard, and the browser-facing rules around them.
//!
//! - **Token**: with `[admin] token` set, a request needs `Authorization: Bearer TOKEN` or
//!   the `warren_admin` cookie. The token is typed once on `/login`; the answer is an
//!   `HttpOnly; SameSite=Strict` cookie `EXPIRY.NONCE.MAC`, the MAC keyed by a key derived
//!   from the token (the page never holds the token). Nothing is stored per login, so a
//!   login survives a restart of the process and ends when the token changes or after
//!   [`LOGIN_TTL`]; a logout is remembered (at most [`MAX_LOGOUTS`]) until its expiry.
//! - **Host** (DNS rebinding): the `Host` a request names must be an IP address,
//!   `localhost`, or one of `[admin] hosts`. A page on `evil.example` whose name was made to
//!   resolve to 127.0.0.1 gets `421`, never the API.
//! - **Origin** (CSRF): a state-changing request (`POST`) whose `Origin` names another site
//!   is refused; one authenticated by the cookie must carry a matching `Origin`. Scripts
//!   using the bearer token send no `Origin` and are not affected.
//! - **Headers**: every answer carries a strict Content-Security-Policy (scripts, styles
//!   and connections from this origin only, no framing), `nosniff` and `no-referrer`. There
//!   is no CORS: no `Access-Control-*` header is ever sent.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rand::RngCore;
use subtle::ConstantTimeEq;

use super::ApiError;
use crate::crypto::hex;
use crate::crypto::secret::Secret;

/// The dashboard's login cookie.
pub const COOKIE: &str = "warren_admin";
/// Logged-out cookies remembered until they expire; beyond that the nearest to expiry go.
pub const MAX_LOGOUTS: usize = 1024;
/// How long a login lasts.
pub const LOGIN_TTL: Duration = Duration::from_secs(12 * 3600);
/// Pause before answering a wrong token, so guessing costs time.
const WRONG_TOKEN_DELAY: Duration = Duration::from_millis(250);

/// The policy every admin answer carries. uPlot styles its canvas through the CSSOM, which
/// `style-src 'self'` allows; nothing is inline.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// How a request proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// No token is configured: anyone who can connect (a loopback bind) may.
    Open,
    /// `Authorization: Bearer` with the token (scripts).
    Bearer,
    /// The login cookie (the dashboard in a browser).
    Cookie,
    /// Nothing valid.
    None,
}

/// The admin listener's gatekeeper: the token, the logged-out cookies and the allowed
/// host names.
#[derive(Debug)]
pub struct Gate {
    token: Option<Secret>,
    /// Keys the login cookies' MACs; derived from the token.
    cookie_key: [u8; 32],
    hosts: Vec<String>,
    /// MACs of logged-out cookies -> when they expire anyway (Unix seconds).
    logouts: Mutex<HashMap<[u8; 32], u64>>,
}

impl Gate {
    /// A gate for `token` (none: open) answering to `hosts` besides IPs and `localhost`.
    pub fn new(token: Option<Secret>, hosts: Vec<String>) -> Gate {
        let cookie_key = token.as_ref().map_or([0; 32], |token| {
            blake3::derive_key("warren admin login cookie v1", token.as_bytes())
        });
        Gate {
            token,
            cookie_key,
            hosts,
            logouts: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a token is configured (the dashboard then needs a login).
    pub fn needs_login(&self) -> bool {
        self.token.is_some()
    }

    /// How `headers` prove who sent them.
    pub fn proof(&self, headers: &HeaderMap) -> Proof {
        let Some(token) = &self.token else {
            return Proof::Open;
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if let Some(offered) = bearer {
            return if bool::from(offered.as_bytes().ct_eq(token.as_bytes())) {
                Proof::Bearer
            } else {
                Proof::None
            };
        }
        match cookie(headers, COOKIE) {
            Some(value) if self.logged_in(value) => Proof::Cookie,
            _ => Proof::None,
        }
    }

    /// Checks a token typed on the login page; on success answers a new cookie value.
    pub async fn login(&self, offered: &str) -> Option<String> {
        let token = self.token.as_ref()?;
        if !bool::from(offered.as_bytes().ct_eq(token.as_bytes())) {
            tokio::time::sleep(WRONG_TOKEN_DELAY).await;
            return None;
        }
        let expiry = now_seconds() + LOGIN_TTL.as_secs();
        let mut nonce = [0u8; 16];
        rand::rng().fill_bytes(&mut nonce);
        let nonce = hex(&nonce);
        let mac = hex(&self.mac(expiry, &nonce));
        Some(format!("{expiry}.{nonce}.{mac}"))
    }

    /// Remembers the cookie behind `headers` as logged out.
    pub fn logout(&self, headers: &HeaderMap) {
        let Some((expiry, mac)) = cookie(headers, COOKIE).and_then(|v| self.verify(v)) else {
            return;
        };
        let now = now_seconds();
        let mut logouts = self.logouts.lock().unwrap_or_else(PoisonError::into_inner);
        logouts.retain(|_, expires| *expires > now);
        if logouts.len() >= MAX_LOGOUTS
            && let Some(nearest) = logouts.iter().min_by_key(|(_, e)| **e).map(|(k, _)| *k)
        {
            logouts.remove(&nearest);
        }
        logouts.insert(mac, expiry);
    }

    fn logged_in(&self, value: &str) -> bool {
        let Some((_, mac)) = self.verify(value) else {
            return false;
        };
        !self
            .logouts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&mac)
    }

    /// A cookie value's expiry and MAC, if the MAC is ours and it has not expired.
    fn verify(&self, value: &str) -> Option<(u64, [u8; 32])> {
        let mut parts = value.split('.');
        let (expiry, nonce, mac) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || nonce.len() != 32 {
            return None;
        }
        let expiry: u64 = expiry.parse().ok()?;
        let expected = self.mac(expiry, nonce);
        if !bool::from(hex(&expected).as_bytes().ct_eq(mac.as_bytes())) {
            return None;
        }
        (expiry > now_seconds()).then_some((expiry, expected))
    }

    fn mac(&self, expiry: u64, nonce: &str) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new_keyed(&self.cookie_key);
        hasher.update(expiry.to_string().as_bytes());
        hasher.update(b".");
        hasher.update(nonce.as_bytes());
        *hasher.finalize().as_bytes()
    }

    /// Whether the host a request names may reach this listener: an IP address (a
    /// rebinding attack needs a DNS name), `localhost` (and `*.localhost`, which browsers
    /// resolve to loopback themselves), or a configured name.
    pub fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        let name = name.trim_end_matches('.');
        name.parse::<std::net::IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.hosts.iter().any(|allowed| allowed == name)
    }
}

/// The decision on one request, before any handler runs: `None` lets it through.
pub fn screen(gate: &Gate, request: &Request<Body>) -> Option<Response> {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .unwrap_or("");
    // No Host at all is not a browser (which always names one), so not a rebinding page.
    if !host.is_empty() && !gate.host_allowed(host) {
        return Some(refuse(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this admin listener does not answer to the host `{}`: open it by IP address or localhost, or list the name in [admin] hosts",
                host_name(host)
            ),
        ));
    }
    let path = request.uri().path();
    let changes_state = !matches!(*request.method(), Method::GET | Method::HEAD);
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    if changes_state
        && let Some(origin) = origin
        && !same_origin(origin, host)
    {
        return Some(refuse(
            StatusCode::FORBIDDEN,
            format!(
                "cross-site request refused: Origin `{origin}` is not this dashboard (`{host}`)"
            ),
        ));
    }
    if is_public(path) {
        return None;
    }
    match gate.proof(headers) {
        Proof::Open | Proof::Bearer => None,
        Proof::Cookie if changes_state && origin.is_none() => Some(refuse(
            StatusCode::FORBIDDEN,
            "a dashboard request that changes state must carry an Origin header: use the dashboard's buttons, or the bearer token from a script".into(),
        )),
        Proof::Cookie => None,
        Proof::None if is_page(path) => Some(redirect("/login")),
        Proof::None => Some(
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                axum::Json(ApiError {
                    error: "missing or wrong credentials: send `Authorization: Bearer <[admin] token>`, or log in to the dashboard at /login".into(),
                }),
            )
                .into_response(),
        ),
    }
}

/// Adds the browser-facing security headers to an answer.
pub fn harden(response: &mut Response) {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        // Not `no-referrer`: with it Chromium sends `Origin: null` on the dashboard's own
        // POSTs, which the Origin check must refuse.
        HeaderValue::from_static("same-origin"),
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
}

/// Paths anyone may fetch: the login page and the static assets (no data in them).
fn is_public(path: &str) -> bool {
    path == "/login" || path == "/readyz" || path.starts_with("/assets/")
}

/// Paths a browser navigates to (answered with the login page's address, not JSON).
fn is_page(path: &str) -> bool {
    path == "/" || path == "/index.html"
}

/// `303 See Other` to `to`.
pub fn redirect(to: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
}

fn refuse(status: StatusCode, error: String) -> Response {
    (status, axum::Json(ApiError { error })).into_response()
}

/// `Set-Cookie` for a login (`value`) or a logout (`None`).
pub fn set_cookie(value: Option<&str>) -> HeaderValue {
    let text = match value {
        Some(value) => format!(
            "{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
            LOGIN_TTL.as_secs()
        ),
        None => format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    };
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The value of cookie `name` in a request's `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

fn now_seconds() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The host of a `Host` value, without its port (`[::1]:7001` -> `::1`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Whether `origin` (`scheme://host[:port]`) names the site the request was sent to.
fn same_origin(origin: &str, host: &str) -> bool {
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    authority.is_some_and(|authority| authority.eq_ignore_ascii_case(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> Gate {
        Gate::new(
            Some(Secret::new("admin-token-0123456789")),
            vec!["warren.example.com".into()],
        )
    }

    fn request(method: Method, path: &str, headers: &[(&str, &str)]) -> Request<Body> {
        let mut builder = Request::builder().method(method).uri(path);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        builder.body(Body::empty()).unwrap()
    }

    #[test]
    fn hosts_by_ip_localhost_or_list_pass_and_others_do_not() {
        let gate = gate();
        for ok in [
            "127.0.0.1:7001",
            "[::1]:7001",
            "localhost:8080",
            "LocalHost",
            "dash.localhost:1",
            "192.0.2.7",
            "warren.example.com:443",
            "Warren.Example.com.",
        ] {
            assert!(gate.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example:7001",
            "",
            "localhost.evil.example",
            "example.com",
        ] {
            assert!(!gate.host_allowed(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_cookie_of_a_login_proves_it_until_logout() {
        let gate = gate();
        assert!(gate.login("wrong").await.is_none());
        let value = gate.login("admin-token-0123456789").await.unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("a=b; {COOKIE}={value}")).unwrap(),
        );
        assert_eq!(gate.proof(&headers), Proof::Cookie);
        gate.logout(&headers);
        assert_eq!(gate.proof(&headers), Proof::None);
    }

    #[tokio::test]
    async fn a_login_outlives_the_process_but_not_the_token_or_a_forgery() {
        let value = gate().login("admin-token-0123456789").await.unwrap();
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::COOKIE,
                HeaderValue::from_str(&format!("{COOKIE}={value}")).unwrap(),
            );
            headers
        };
        // Another gate with the same token (a restarted process) accepts it.
        assert_eq!(gate().proof(&with(&value)), Proof::Cookie);
        // A new token does not.
        let other = Gate::new(Some(Secret::new("another-token-0123456789")), Vec::new());
        assert_eq!(other.proof(&with(&value)), Proof::None);
        // Neither does a longer expiry with the old MAC, nor garbage.
        let (expiry, rest) = value.split_once('.').unwrap();
        let extended = format!("{}.{rest}", expiry.parse::<u64>().unwrap() + 1000);
        for forged in [&extended[..], "1.2.3", "", "...", "99999999999.x.y"] {
            assert_eq!(gate().proof(&with(forged)), Proof::None, "{forged}");
        }
    }

    #[tokio::test]
    async fn logouts_are_bounded() {
        let gate = gate();
        for _ in 0..MAX_LOGOUTS + 10 {
            let value = gate.login("admin-token-0123456789").await.unwrap();
            let mut headers = HeaderMap::new();
            headers.insert(
                header::COOKIE,
                HeaderValue::from_str(&format!("{COOKIE}={value}")).unwrap(),
            );
            gate.logout(&headers);
        }
        assert_eq!(gate.logouts.lock().unwrap().len(), MAX_LOGOUTS);
    }

    #[test]
    fn screening() {
        let gate = gate();
        let host = ("host", "127.0.0.1:7001");
        // Rebinding: a foreign name.
        let r = screen(
            &gate,
            &request(
                Method::GET,
                "/api/v1/status",
                &[("host", "evil.example:7001")],
            ),
        );
        assert_eq!(r.unwrap().status(), StatusCode::MISDIRECTED_REQUEST);
        // No credentials: the API says 401, the page sends to the login.
        let r = screen(&gate, &request(Method::GET, "/api/v1/status", &[host]));
        assert_eq!(r.unwrap().status(), StatusCode::UNAUTHORIZED);
        let r = screen(&gate, &request(Method::GET, "/", &[host])).unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        assert_eq!(r.headers()[header::LOCATION], "/login");
        // Public paths.
        assert!(screen(&gate, &request(Method::GET, "/login", &[host])).is_none());
        assert!(screen(&gate, &request(Method::GET, "/assets/app.js", &[host])).is_none());
        // Bearer, with or without a matching Origin; a foreign Origin is refused.
        let bearer = ("authorization", "Bearer admin-token-0123456789");
        assert!(
            screen(
                &gate,
                &request(Method::POST, "/api/v1/reload", &[host, bearer])
            )
            .is_none()
        );
        let foreign = ("origin", "http://evil.example");
        let r = screen(
            &gate,
            &request(Method::POST, "/api/v1/reload", &[host, bearer, foreign]),
        );
        assert_eq!(r.unwrap().status(), StatusCode::FORBIDDEN);
        let r = screen(&gate, &request(Method::POST, "/login", &[host, foreign]));
        assert_eq!(r.unwrap().status(), StatusCode::FORBIDDEN);
        let same = ("origin", "http://127.0.0.1:7001");
        assert!(screen(&gate, &request(Method::POST, "/login", &[host, same])).is_none());
    }

    #[test]
    fn open_gate_still_refuses_cross_site_posts() {
        let gate = Gate::new(None, Vec::new());
        let host = ("host", "127.0.0.1:7001");
        assert!(screen(&gate, &request(Method::POST, "/api/v1/reload", &[host])).is_none());
        let r = screen(
            &gate,
            &request(
                Method::POST,
                "/api/v1/reload",
                &[host, ("origin", "https://evil.example")],
            ),
        );
        assert_eq!(r.unwrap().status(), StatusCode::FORBIDDEN);
    }
}
