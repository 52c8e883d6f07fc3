//! `rate_limit`: at most `rate` requests per key (the visitor's address, the whole
//! service, or a header's value), with bursts up to `burst`; the rest get 429 with
//! `Retry-After`.
//!
//! Built on governor's keyed GCRA limiter: one small state (8 bytes) per key in a
//! concurrent map, driven by tokio's clock (so tests can pause time).
//!
//! # Keys and their bound
//!
//! * `client_ip`: [`RequestContext::client_ip`]; IPv6 visitors are grouped by /64, since
//!   one host usually holds a whole /64 and could otherwise dodge the limit by changing
//!   address.
//! * `route`: one bucket for the whole service.
//! * `header:NAME`: a hash of the header's value (an API key, a tenant id); a request
//!   without the header is keyed by its client address instead, so header-less visitors
//!   do not all share (and exhaust) one bucket.
//!
//! The key table holds at most `max_keys` keys (default [`DEFAULT_MAX_KEYS`], a few MiB).
//! From half full on, keys whose bucket has refilled (they would behave like a new key
//! anyway) are swept out, at most once per [`SWEEP_INTERVAL`]. If the table is still full
//! after a sweep, which takes that many distinct visitors within one refill period,
//! requests are answered 429 until there is room again: the limiter fails closed rather
//! than forgetting everyone's limits.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{Request, Response, StatusCode};

use super::{BoxFuture, Flow, Middleware, RequestContext};
use crate::http::Body;
use crate::http::page::error_page;

/// Keys kept by default before sweeping and then refusing.
pub const DEFAULT_MAX_KEYS: usize = 65_536;

/// The shortest time between two sweeps of the key table.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(250);

/// A rate: `count` requests per `per`, written `"100/s"`, `"30/m"` or `"1000/h"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Requests allowed per period.
    pub count: NonZeroU32,
    /// The period.
    pub per: Duration,
}

/// Why a rate string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a rate")]
pub struct RateError(pub String);

impl RateError {
    /// How to write one.
    pub fn hint(&self) -> &'static str {
        "write requests per second, minute or hour, e.g. \"100/s\", \"30/m\" or \"1000/h\" (at least 1)"
    }
}

impl FromStr for Rate {
    type Err = RateError;

    fn from_str(text: &str) -> Result<Rate, RateError> {
        let error = || RateError(text.to_owned());
        let (count, unit) = text.trim().split_once('/').ok_or_else(error)?;
        let count: u32 = count.trim().parse().map_err(|_| error())?;
        let count = NonZeroU32::new(count).ok_or_else(error)?;
        let per = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            _ => return Err(error()),
        };
        Ok(Rate { count, per })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.per.as_secs() {
            1 => "s",
            60 => "m",
            _ => "h",
        };
        write!(f, "{}/{unit}", self.count)
    }
}

/// What requests are counted by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyBy {
    /// The visitor's address (IPv6 by /64).
    ClientIp,
    /// One bucket for the whole service.
    Route,
    /// A header's value; requests without it are keyed by client address.
    Header(HeaderName),
}

impl FromStr for KeyBy {
    type Err = String;

    fn from_str(text: &str) -> Result<KeyBy, String> {
        match text.trim() {
            "client_ip" => Ok(KeyBy::ClientIp),
            "route" => Ok(KeyBy::Route),
            other => {
                let Some(name) = other.strip_prefix("header:") else {
                    return Err(format!("unknown key {other:?}"));
                };
                HeaderName::from_bytes(name.trim().as_bytes())
                    .map(KeyBy::Header)
                    .map_err(|_| format!("{name:?} is not a header name"))
            }
        }
    }
}

impl fmt::Display for KeyBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyBy::ClientIp => f.write_str("client_ip"),
            KeyBy::Route => f.write_str("route"),
            KeyBy::Header(name) => write!(f, "header:{name}"),
        }
    }
}

/// A key of the table: small and fixed-size whatever the request held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Ip(IpAddr),
    Route,
    Header([u8; 16]),
}

/// governor's clock, read from tokio's (pausable) clock.
#[derive(Debug, Clone)]
struct TokioClock {
    origin: tokio::time::Instant,
}

impl Clock for TokioClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::from(self.origin.elapsed())
    }
}

type KeyedLimiter = RateLimiter<Key, DashMapStateStore<Key>, TokioClock, NoOpMiddleware<Nanos>>;

/// The `rate_limit` middleware.
pub struct RateLimit {
    key_by: KeyBy,
    limiter: KeyedLimiter,
    clock: TokioClock,
    max_keys: usize,
    /// When the table was last swept (nanoseconds on `clock`).
    last_sweep: AtomicU64,
}

impl RateLimit {
    /// A limiter of `rate` per key with bursts of `burst`, holding at most `max_keys` keys.
    ///
    /// # Errors
    /// `max_keys` is zero, or the rate's period per request is zero (over a billion per
    /// second).
    pub fn new(
        rate: Rate,
        burst: NonZeroU32,
        key_by: KeyBy,
        max_keys: usize,
    ) -> Result<RateLimit, String> {
        if max_keys == 0 {
            return Err("max_keys must be at least 1".to_owned());
        }
        let quota = Quota::with_period(rate.per / rate.count.get())
            .ok_or_else(|| format!("rate {rate} is too high"))?
            .allow_burst(burst);
        let clock = TokioClock {
            origin: tokio::time::Instant::now(),
        };
        Ok(RateLimit {
            key_by,
            limiter: RateLimiter::dashmap_with_clock(quota, clock.clone()),
            clock,
            max_keys,
            last_sweep: AtomicU64::new(0),
        })
    }

    fn key(&self, request: &Request<Body>, cx: &RequestContext) -> Key {
        match &self.key_by {
            KeyBy::ClientIp => Key::Ip(group(cx.client_ip)),
            KeyBy::Route => Key::Route,
            KeyBy::Header(name) => match request.headers().get(name) {
                Some(value) => {
                    let hash = blake3::hash(value.as_bytes());
                    let mut short = [0; 16];
                    short.copy_from_slice(&hash.as_bytes()[..16]);
                    Key::Header(short)
                }
                None => Key::Ip(group(cx.client_ip)),
            },
        }
    }

    /// Sweeps the table when it is half full (at most once per [`SWEEP_INTERVAL`]);
    /// whether there is room for a new key.
    fn has_room(&self) -> bool {
        let len = self.limiter.len();
        if len < self.max_keys / 2 {
            return true;
        }
        let now = self.clock.now().as_u64();
        let last = self.last_sweep.load(Ordering::Relaxed);
        let due = now.saturating_sub(last) >= SWEEP_INTERVAL.as_nanos() as u64 || last == 0;
        if due
            && self
                .last_sweep
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
        self.limiter.len() < self.max_keys
    }

    /// How many keys the table holds now.
    pub fn keys(&self) -> usize {
        self.limiter.len()
    }

    fn limited(&self, cx: &mut RequestContext, wait: Duration, outcome: String) -> Flow {
        cx.decide("rate_limit", outcome);
        // Whole seconds, rounded up, at least 1: `Retry-After: 0` invites a retry storm.
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let seconds = seconds.max(1);
        let mut response: Response<Body> = error_page(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many requests",
            &format!(
                "{} limits how often it may be asked. Try again in {seconds} second{}.",
                cx.host,
                if seconds == 1 { "" } else { "s" }
            ),
        );
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
        Flow::Respond(response)
    }
}

impl Middleware for RateLimit {
    fn name(&self) -> &str {
        "rate_limit"
    }

    fn on_request<'a>(
        &'a self,
        request: &'a mut Request<Body>,
        cx: &'a mut RequestContext,
    ) -> BoxFuture<'a, Flow> {
        let key = self.key(request, cx);
        let flow = if !self.has_room() {
            self.limited(
                cx,
                SWEEP_INTERVAL,
                format!("refused: more than {} keys at once", self.max_keys),
            )
        } else {
            match self.limiter.check_key(&key) {
                Ok(()) => Flow::Continue,
                Err(not_until) => {
                    let wait = not_until.wait_time_from(self.clock.now());
                    let shown = match key {
                        Key::Ip(address) => address.to_string(),
                        Key::Route => "route".to_owned(),
                        Key::Header(_) => format!("{}", self.key_by),
                    };
                    self.limited(cx, wait, format!("limited {shown}"))
                }
            }
        };
        Box::pin(std::future::ready(flow))
    }
}

impl fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("key_by", &self.key_by)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

/// IPv4 as is; IPv6 cut to its /64 (mapped IPv4 as IPv4).
fn group(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !(u128::from(u64::MAX));
            IpAddr::V6(Ipv6Addr::from(bits))
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::middleware::testing::{context_from, get, run};

    fn limit(rate: &str, burst: u32, key_by: KeyBy) -> RateLimit {
        RateLimit::new(
            rate.parse().expect("valid rate"),
            NonZeroU32::new(burst).expect("nonzero"),
            key_by,
            DEFAULT_MAX_KEYS,
        )
        .expect("valid limit")
    }

    async fn passes(limit: &RateLimit, from: &str) -> Result<(), Response<Body>> {
        let mut cx = context_from(from.parse().expect("ip"));
        match run(limit, &mut get("/"), &mut cx).await {
            None => Ok(()),
            Some(response) => Err(response),
        }
    }

    #[test]
    fn rates_parse() {
        let rate: Rate = "100/s".parse().expect("valid");
        assert_eq!((rate.count.get(), rate.per), (100, Duration::from_secs(1)));
        assert_eq!(
            "30/m".parse::<Rate>().expect("valid").per,
            Duration::from_secs(60)
        );
        assert_eq!(" 5 / h ".parse::<Rate>().expect("valid").to_string(), "5/h");
        for bad in [
            "",
            "100",
            "0/s",
            "-1/s",
            "100/d",
            "x/s",
            "100/",
            "4294967296/s",
        ] {
            let error = bad.parse::<Rate>().expect_err(bad);
            assert!(error.hint().contains("100/s"));
        }
        assert_eq!("client_ip".parse::<KeyBy>(), Ok(KeyBy::ClientIp));
        assert_eq!("route".parse::<KeyBy>(), Ok(KeyBy::Route));
        assert_eq!(
            "header:X-Api-Key".parse::<KeyBy>(),
            Ok(KeyBy::Header(HeaderName::from_static("x-api-key")))
        );
        assert!("header:bad header".parse::<KeyBy>().is_err());
        assert!("cookie".parse::<KeyBy>().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn burst_then_429_with_retry_after_then_refill() {
        let limit = limit("2/s", 3, KeyBy::ClientIp);
        for _ in 0..3 {
            assert!(passes(&limit, "198.51.100.1").await.is_ok());
        }
        let response = passes(&limit, "198.51.100.1").await.expect_err("limited");
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[RETRY_AFTER], "1");
        // Another visitor has their own bucket.
        assert!(passes(&limit, "198.51.100.2").await.is_ok());
        // Half a second refills one request (2/s).
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(passes(&limit, "198.51.100.1").await.is_ok());
        assert!(passes(&limit, "198.51.100.1").await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn slow_rates_ask_for_a_longer_wait() {
        let limit = limit("1/m", 1, KeyBy::Route);
        assert!(passes(&limit, "198.51.100.1").await.is_ok());
        // `route` is one bucket for everyone.
        let response = passes(&limit, "198.51.100.2").await.expect_err("limited");
        assert_eq!(response.headers()[RETRY_AFTER], "60");
    }

    #[tokio::test(start_paused = true)]
    async fn ipv6_is_limited_by_its_64() {
        let limit = limit("1/s", 1, KeyBy::ClientIp);
        assert!(passes(&limit, "2001:db8:1:2::1").await.is_ok());
        assert!(
            passes(&limit, "2001:db8:1:2::ffff").await.is_err(),
            "same /64"
        );
        assert!(passes(&limit, "2001:db8:1:3::1").await.is_ok(), "next /64");
    }

    #[tokio::test(start_paused = true)]
    async fn header_keys_are_independent_and_fall_back_to_the_address() {
        let limit = limit(
            "1/s",
            1,
            KeyBy::Header(HeaderName::from_static("x-api-key")),
        );
        let with_key = |key: &str| {
            let mut request = get("/");
            request
                .headers_mut()
                .insert("x-api-key", HeaderValue::from_str(key).expect("ascii"));
            request
        };
        let mut cx = context_from("198.51.100.1".parse().expect("ip"));
        assert!(run(&limit, &mut with_key("a"), &mut cx).await.is_none());
        assert!(run(&limit, &mut with_key("a"), &mut cx).await.is_some());
        assert!(run(&limit, &mut with_key("b"), &mut cx).await.is_none());
        // No header: by address, so this one is fresh...
        assert!(run(&limit, &mut get("/"), &mut cx).await.is_none());
        // ...and another address without the header is too.
        assert!(passes(&limit, "198.51.100.9").await.is_ok());
        assert_eq!(
            cx.decisions,
            [("rate_limit".into(), "limited header:x-api-key".into())]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_key_table_is_bounded() {
        let limit = RateLimit::new(
            "1/s".parse().expect("valid"),
            NonZeroU32::new(1).expect("nonzero"),
            KeyBy::ClientIp,
            8,
        )
        .expect("valid");
        for i in 0..8 {
            assert!(passes(&limit, &format!("198.51.100.{i}")).await.is_ok());
        }
        assert!(limit.keys() <= 8);
        // Full of fresh keys: a new visitor is refused rather than making room by
        // forgetting the others' limits.
        let response = passes(&limit, "198.51.100.200").await.expect_err("full");
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(limit.keys() <= 8);
        // Once their buckets have refilled, a sweep makes room.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(passes(&limit, "198.51.100.200").await.is_ok());
        assert_eq!(limit.keys(), 1);
    }
}
