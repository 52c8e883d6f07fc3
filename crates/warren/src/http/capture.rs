//! Request capture for the inspector: the recent requests of every http service, with
//! their headers, timings, what the middleware decided, and (when a service asks for it)
//! the first bytes of the bodies.
//!
//! The forwarding path never waits for the inspector: a finished request's record goes into
//! a lock-free bounded queue, which wakes nothing. Whoever finds the queue full (a request)
//! or reads the rings (the admin API) moves the queued records into a ring per service
//! ([`RING_PER_SERVICE`] records; the oldest leaves first); a request that finds the queue
//! full while the rings are busy drops its record and counts it
//! (`warren_http_captures_dropped`) rather than wait. (A first version fed a drain task
//! through a channel: waking it cost ~30 µs per request at one request at a time.)
//!
//! Secrets stay out of what the API shows: `Authorization`, `Proxy-Authorization`,
//! `Cookie` and `Set-Cookie` values are redacted when a record is read. The record keeps
//! the original request headers only so that a replay can send the same request again.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Frame, SizeHint};
use serde::Serialize;

use super::{Body, BoxError};
use crate::metrics::Telemetry;

/// Records kept per service.
pub const RING_PER_SERVICE: usize = 256;

/// Finished requests waiting to be moved into the rings.
pub const QUEUE: usize = 1024;

/// Most body bytes a service may ask to keep (`capture_body_bytes`).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Header values the API never shows.
const REDACTED: [&str; 4] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
];

/// One request as the inspector sees it.
#[derive(Debug, Clone, Serialize)]
pub struct CapturedRequest {
    /// Request number (unique in this process).
    pub id: u64,
    /// When it arrived, Unix milliseconds.
    pub at_ms: u64,
    /// The service it was routed to.
    pub service: String,
    /// Method.
    pub method: String,
    /// The routed host.
    pub host: String,
    /// Path and query as the visitor sent them.
    pub uri: String,
    /// HTTP version (`HTTP/1.1`, `HTTP/2.0`).
    pub version: String,
    /// The visitor's address (see `trusted_proxies`).
    pub client_ip: String,
    /// Came in over TLS.
    pub tls: bool,
    /// Response status.
    pub status: u16,
    /// Time to the response head, microseconds.
    pub head_us: u64,
    /// Time to the end of the response body, microseconds.
    pub total_us: u64,
    /// Response body bytes sent.
    pub response_bytes: u64,
    /// Request headers (secrets redacted when read through [`Captures`]).
    pub request_headers: Vec<(String, String)>,
    /// Response headers (secrets redacted).
    pub response_headers: Vec<(String, String)>,
    /// The first bytes of the request body, when the service captures bodies.
    pub request_body: Option<String>,
    /// The request body was captured whole (a replay can send it again).
    pub request_body_complete: bool,
    /// The first bytes of the response body, when the service captures bodies.
    pub response_body: Option<String>,
    /// What each middleware decided that mattered, in order.
    pub decisions: Vec<(String, String)>,
    /// Which request this one replayed.
    pub replay_of: Option<u64>,
    /// The headers as they came (copied flat: turned into the lists above, redacted, only
    /// when the API reads a record).
    #[serde(skip)]
    raw_request_headers: FlatHeaders,
    #[serde(skip)]
    raw_response_headers: FlatHeaders,
    #[serde(skip)]
    raw_request_body: Bytes,
}

/// The summary the request list shows.
#[derive(Debug, Clone, Serialize)]
pub struct RequestSummary {
    /// Request number.
    pub id: u64,
    /// Arrival, Unix ms.
    pub at_ms: u64,
    /// Service.
    pub service: String,
    /// Method.
    pub method: String,
    /// Host.
    pub host: String,
    /// Path and query.
    pub uri: String,
    /// Status.
    pub status: u16,
    /// Time to the end of the response, µs.
    pub total_us: u64,
    /// Response bytes.
    pub response_bytes: u64,
    /// Visitor address.
    pub client_ip: String,
}

/// What a replay needs of a captured request.
#[derive(Debug)]
pub struct ReplayRequest {
    /// Method.
    pub method: http::Method,
    /// Path and query.
    pub uri: String,
    /// The original headers (unredacted).
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
    /// Came in over TLS.
    pub tls: bool,
}

/// The rings of every service, and the queue that feeds them.
pub struct Captures {
    queue: crossbeam_queue::ArrayQueue<CapturedRequest>,
    rings: Mutex<Rings>,
    telemetry: Arc<Telemetry>,
}

/// The newest records of each service, by service name.
type Rings = HashMap<String, VecDeque<Arc<CapturedRequest>>>;

fn push(rings: &mut Rings, record: CapturedRequest) {
    // Looked up first: `entry` would take (so clone) the service's name for every record.
    let ring = match rings.get_mut(&record.service) {
        Some(ring) => ring,
        None => rings.entry(record.service.clone()).or_default(),
    };
    if ring.len() >= RING_PER_SERVICE {
        ring.pop_front();
    }
    ring.push_back(Arc::new(record));
}

impl std::fmt::Debug for Captures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Captures").finish_non_exhaustive()
    }
}

impl Captures {
    /// An empty store.
    pub fn new(telemetry: Arc<Telemetry>) -> Arc<Captures> {
        Arc::new(Captures {
            queue: crossbeam_queue::ArrayQueue::new(QUEUE),
            rings: Mutex::new(HashMap::new()),
            telemetry,
        })
    }

    /// Offers a finished record. A full queue is moved into the rings first, unless the
    /// rings are busy: then the record is dropped (and counted) rather than wait.
    pub fn offer(&self, record: CapturedRequest) {
        let Err(record) = self.queue.push(record) else {
            return;
        };
        match self.rings.try_lock() {
            Ok(mut rings) => {
                self.fold(&mut rings);
                push(&mut rings, record);
            }
            Err(std::sync::TryLockError::Poisoned(poisoned)) => {
                let mut rings = poisoned.into_inner();
                self.fold(&mut rings);
                push(&mut rings, record);
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                self.telemetry.metrics.http_capture_dropped();
            }
        }
    }

    /// The rings, with every queued record moved in.
    fn rings(&self) -> std::sync::MutexGuard<'_, Rings> {
        let mut rings = self.rings.lock().unwrap_or_else(PoisonError::into_inner);
        self.fold(&mut rings);
        rings
    }

    fn fold(&self, rings: &mut Rings) {
        while let Some(record) = self.queue.pop() {
            push(rings, record);
        }
    }

    /// Forgets the rings of services no longer configured.
    pub fn retain_services(&self, keep: &dyn Fn(&str) -> bool) {
        self.rings().retain(|service, _| keep(service));
    }

    /// The newest records first, optionally of one service.
    pub fn list(&self, service: Option<&str>) -> Vec<RequestSummary> {
        let rings = self.rings();
        let mut all: Vec<RequestSummary> = rings
            .iter()
            .filter(|(name, _)| service.is_none_or(|s| s == name.as_str()))
            .flat_map(|(_, ring)| ring.iter())
            .map(|r| summary(r))
            .collect();
        all.sort_by_key(|r| std::cmp::Reverse(r.id));
        all
    }

    /// Records with an id above `after`, oldest first, at most `limit` (the newest of them
    /// when more arrived): what a live listener has not seen yet. (A request that finishes
    /// after a newer one was listed is not listed again; the full list still has it.)
    pub fn since(&self, after: u64, limit: usize) -> Vec<RequestSummary> {
        let rings = self.rings();
        let mut new: Vec<&Arc<CapturedRequest>> = rings
            .values()
            .flat_map(|ring| ring.iter().filter(|r| r.id > after))
            .collect();
        new.sort_by_key(|r| r.id);
        let skip = new.len().saturating_sub(limit);
        new[skip..].iter().map(|r| summary(r)).collect()
    }

    /// One record, secrets redacted.
    pub fn get(&self, id: u64) -> Option<CapturedRequest> {
        let found = self.find(id)?;
        let mut record = (*found).clone();
        record.request_headers = record.raw_request_headers.to_list();
        record.response_headers = record.raw_response_headers.to_list();
        redact(&mut record.request_headers);
        redact(&mut record.response_headers);
        Some(record)
    }

    /// What a replay of `id` sends. `Err` says why it cannot be replayed.
    ///
    /// # Errors
    /// An unknown id, or a body that was not captured whole.
    pub fn replay_request(&self, id: u64) -> Result<ReplayRequest, String> {
        let found = self
            .find(id)
            .ok_or_else(|| format!("no captured request {id} (it may have left the ring)"))?;
        let has_body = found
            .raw_request_headers
            .get(&http::header::CONTENT_LENGTH)
            .is_some_and(|v| v != b"0")
            || found
                .raw_request_headers
                .contains(&http::header::TRANSFER_ENCODING);
        if has_body && !found.request_body_complete {
            return Err(format!(
                "request {id} had a body that was not captured whole; set capture_body_bytes on the service (up to {MAX_BODY_BYTES}) to replay such requests"
            ));
        }
        Ok(ReplayRequest {
            method: found.method.parse().map_err(|_| "bad method".to_owned())?,
            uri: found.uri.clone(),
            headers: found.raw_request_headers.to_map(),
            body: found.raw_request_body.clone(),
            tls: found.tls,
        })
    }

    fn find(&self, id: u64) -> Option<Arc<CapturedRequest>> {
        self.rings()
            .values()
            .flat_map(|ring| ring.iter())
            .find(|r| r.id == id)
            .cloned()
    }
}

fn summary(r: &CapturedRequest) -> RequestSummary {
    RequestSummary {
        id: r.id,
        at_ms: r.at_ms,
        service: r.service.clone(),
        method: r.method.clone(),
        host: r.host.clone(),
        uri: r.uri.clone(),
        status: r.status,
        total_us: r.total_us,
        response_bytes: r.response_bytes,
        client_ip: r.client_ip.clone(),
    }
}

/// What a secret header's value reads as in a captured record.
pub const REDACTED_VALUE: &str = "(redacted)";

fn redact(headers: &mut [(String, String)]) {
    for (name, value) in headers {
        if REDACTED.contains(&name.as_str()) {
            REDACTED_VALUE.clone_into(value);
        }
    }
}

/// Headers copied into one buffer, each as its name's and value's lengths and bytes.
///
/// Why not keep the `HeaderMap`: the values hyper parses are slices of the connection's
/// read buffer, so a cloned map kept that whole buffer alive for as long as the record
/// lived in its ring (256 records of 100 KiB responses held ~175 MB). One copy into one
/// allocation is also cheaper than cloning the map.
#[derive(Debug, Clone, Default)]
struct FlatHeaders(Box<[u8]>);

impl FlatHeaders {
    fn new(headers: &HeaderMap) -> FlatHeaders {
        let len: usize = headers
            .iter()
            .map(|(name, value)| 8 + name.as_str().len() + value.len())
            .sum();
        let mut flat = Vec::with_capacity(len);
        for (name, value) in headers {
            for part in [name.as_str().as_bytes(), value.as_bytes()] {
                // A header is far shorter than 4 GiB (hyper refuses heads over 400 KiB).
                let part_len = u32::try_from(part.len()).unwrap_or(u32::MAX);
                flat.extend_from_slice(&part_len.to_le_bytes());
                flat.extend_from_slice(&part[..part_len as usize]);
            }
        }
        FlatHeaders(flat.into_boxed_slice())
    }

    /// Names and values, in the map's order.
    fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let mut rest: &[u8] = &self.0;
        let mut next = move || {
            let (len, tail) = rest.split_first_chunk::<4>()?;
            let (part, tail) = tail.split_at_checked(u32::from_le_bytes(*len) as usize)?;
            rest = tail;
            Some(part)
        };
        std::iter::from_fn(move || Some((next()?, next()?)))
    }

    fn get(&self, name: &http::HeaderName) -> Option<&[u8]> {
        let name = name.as_str().as_bytes();
        self.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, value)| value)
    }

    fn contains(&self, name: &http::HeaderName) -> bool {
        self.get(name).is_some()
    }

    fn to_list(&self) -> Vec<(String, String)> {
        self.iter()
            .map(|(name, value)| {
                (
                    String::from_utf8_lossy(name).into_owned(),
                    String::from_utf8_lossy(value).into_owned(),
                )
            })
            .collect()
    }

    fn to_map(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in self.iter() {
            // They were a valid name and value when copied.
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name),
                http::HeaderValue::from_bytes(value),
            ) {
                map.append(name, value);
            }
        }
        map
    }
}

/// A request being captured: filled in as the request goes through, sent when its
/// response body ends (or is dropped).
pub struct Capture {
    record: CapturedRequest,
    started: tokio::time::Instant,
    body_limit: usize,
    request_body: Option<Arc<Mutex<BodyCopy>>>,
    captures: Arc<Captures>,
}

/// The first bytes of a body, and whether it ended within them.
#[derive(Default)]
struct BodyCopy {
    bytes: Vec<u8>,
    complete: bool,
}

impl Capture {
    /// Starts capturing a request that arrived at `started` (`body_limit` 0: no bodies).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        captures: Arc<Captures>,
        id: u64,
        request: &http::Request<Body>,
        service: &str,
        host: &str,
        client_ip: std::net::IpAddr,
        tls: bool,
        started: tokio::time::Instant,
        body_limit: usize,
    ) -> Capture {
        let uri = request
            .uri()
            .path_and_query()
            .map_or_else(|| "/".to_owned(), ToString::to_string);
        Capture {
            record: CapturedRequest {
                id,
                at_ms: crate::metrics::unix_millis_now(),
                service: service.to_owned(),
                method: request.method().to_string(),
                host: host.to_owned(),
                uri,
                version: format!("{:?}", request.version()),
                client_ip: client_ip.to_string(),
                tls,
                status: 0,
                head_us: 0,
                total_us: 0,
                response_bytes: 0,
                request_headers: Vec::new(),
                response_headers: Vec::new(),
                request_body: None,
                request_body_complete: false,
                response_body: None,
                decisions: Vec::new(),
                replay_of: None,
                raw_request_headers: FlatHeaders::new(request.headers()),
                raw_response_headers: FlatHeaders::default(),
                raw_request_body: Bytes::new(),
            },
            started,
            body_limit: body_limit.min(MAX_BODY_BYTES),
            request_body: None,
            captures,
        }
    }

    /// Marks the request as a replay of `id`.
    pub fn replay_of(&mut self, id: u64) {
        self.record.replay_of = Some(id);
    }

    /// Wraps the request body so its first bytes are kept (no-op without body capture).
    pub fn tee_request(&mut self, body: Body) -> Body {
        if self.body_limit == 0 {
            return body;
        }
        let copy = Arc::new(Mutex::new(BodyCopy::default()));
        self.request_body = Some(Arc::clone(&copy));
        use http_body_util::BodyExt;
        Tee {
            inner: body,
            copy,
            limit: self.body_limit,
        }
        .boxed_unsync()
    }

    /// Finishes the record with the response head and wraps the response body: the record
    /// is offered when that body ends or is dropped.
    pub fn finish(
        mut self,
        response: http::Response<Body>,
        decisions: &[(String, String)],
    ) -> http::Response<Body> {
        self.record.status = response.status().as_u16();
        self.record.head_us = micros(self.started.elapsed());
        self.record.raw_response_headers = FlatHeaders::new(response.headers());
        decisions.clone_into(&mut self.record.decisions);
        let (parts, body) = response.into_parts();
        let keep = self.body_limit;
        let body = super::body::observe(body, keep, move |end| self.offer(end));
        http::Response::from_parts(parts, body)
    }

    fn offer(mut self, end: super::body::BodyEnd) {
        self.record.response_bytes = end.bytes;
        self.record.total_us = micros(self.started.elapsed());
        if let Some(copy) = &self.request_body {
            let copy = copy.lock().unwrap_or_else(PoisonError::into_inner);
            self.record.request_body = Some(String::from_utf8_lossy(&copy.bytes).into_owned());
            self.record.request_body_complete = copy.complete;
            self.record.raw_request_body = Bytes::copy_from_slice(&copy.bytes);
        } else if !self
            .record
            .raw_request_headers
            .contains(&http::header::CONTENT_LENGTH)
            && !self
                .record
                .raw_request_headers
                .contains(&http::header::TRANSFER_ENCODING)
        {
            // No body at all: a replay sends none.
            self.record.request_body_complete = true;
        }
        if self.body_limit > 0 {
            self.record.response_body = Some(String::from_utf8_lossy(&end.prefix).into_owned());
        }
        self.captures.offer(self.record);
    }
}

fn micros(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// A request body that keeps a copy of its first bytes.
struct Tee {
    inner: Body,
    copy: Arc<Mutex<BodyCopy>>,
    limit: usize,
}

impl http_body::Body for Tee {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let mut copy = self.copy.lock().unwrap_or_else(PoisonError::into_inner);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let room = self.limit.saturating_sub(copy.bytes.len());
                    if data.len() > room {
                        // Too long to keep whole: a replay is impossible.
                        copy.complete = false;
                        copy.bytes.extend_from_slice(&data[..room]);
                        drop(copy);
                        self.limit = 0;
                        return polled;
                    }
                    copy.bytes.extend_from_slice(data);
                    // A body with a known length ends with its last data frame: the
                    // consumer may never poll for the end.
                    if self.inner.is_end_stream() {
                        copy.complete = true;
                    }
                }
            }
            Poll::Ready(None) if self.limit > 0 => copy.complete = true,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Side;
    use http_body_util::BodyExt;

    fn captures() -> Arc<Captures> {
        Captures::new(Telemetry::new(Side::Server))
    }

    fn request(body: &'static [u8]) -> http::Request<Body> {
        http::Request::builder()
            .method("POST")
            .uri("/api?x=1")
            .header("authorization", "Bearer secret")
            .header("content-length", body.len().to_string())
            .body(crate::http::full(body))
            .unwrap()
    }

    #[tokio::test]
    async fn a_finished_request_lands_in_its_ring_with_secrets_redacted() {
        let store = captures();
        let mut request = request(b"hello");
        let mut capture = Capture::start(
            Arc::clone(&store),
            7,
            &request,
            "app",
            "app.test",
            "192.0.2.1".parse().unwrap(),
            false,
            tokio::time::Instant::now(),
            1024,
        );
        let body = std::mem::replace(request.body_mut(), crate::http::empty());
        let sent = capture
            .tee_request(body)
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(sent, "hello");
        let response = http::Response::builder()
            .status(201)
            .header("set-cookie", "id=1")
            .body(crate::http::full("world"))
            .unwrap();
        let response = capture.finish(response, &[("ip_allow".into(), "allowed".into())]);
        let got = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(got, "world");
        let record = store.get(7).expect("captured");
        assert_eq!((record.status, record.response_bytes), (201, 5));
        assert_eq!(record.request_body.as_deref(), Some("hello"));
        assert!(record.request_body_complete);
        assert_eq!(record.response_body.as_deref(), Some("world"));
        assert!(
            record
                .request_headers
                .iter()
                .any(|(n, v)| n == "authorization" && v == "(redacted)")
        );
        assert!(
            record
                .response_headers
                .iter()
                .any(|(n, v)| n == "set-cookie" && v == "(redacted)")
        );
        let replay = store.replay_request(7).unwrap();
        assert_eq!(replay.body, "hello");
        assert_eq!(replay.headers["authorization"], "Bearer secret");
        assert_eq!(store.list(None)[0].id, 7);
        assert!(store.list(Some("other")).is_empty());
        drop(store);
    }

    #[tokio::test]
    async fn bodies_longer_than_the_limit_are_cut_and_not_replayable() {
        let store = captures();
        let mut request = request(b"0123456789");
        let mut capture = Capture::start(
            Arc::clone(&store),
            1,
            &request,
            "app",
            "app.test",
            "192.0.2.1".parse().unwrap(),
            false,
            tokio::time::Instant::now(),
            4,
        );
        let body = std::mem::replace(request.body_mut(), crate::http::empty());
        let sent = capture
            .tee_request(body)
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(sent, "0123456789", "the backend gets the whole body");
        drop(capture.finish(http::Response::new(crate::http::empty()), &[]));
        let record = store.get(1).unwrap();
        assert_eq!(record.request_body.as_deref(), Some("0123"));
        assert!(!record.request_body_complete);
        assert!(
            store
                .replay_request(1)
                .unwrap_err()
                .contains("capture_body_bytes")
        );
    }

    #[test]
    fn flat_headers_keep_every_value_in_order_and_none_of_the_source_buffer() {
        let source = Bytes::from(b"text/plain;a=1\xff".repeat(1000));
        let mut map = HeaderMap::new();
        map.append("x-a", http::HeaderValue::from_static("1"));
        map.append("x-a", http::HeaderValue::from_static(""));
        let value = http::HeaderValue::from_maybe_shared(source.slice(0..15)).unwrap();
        map.append("content-type", value);
        let flat = FlatHeaders::new(&map);
        assert_eq!(flat.to_map(), map);
        assert_eq!(
            flat.to_list(),
            [
                ("x-a".to_owned(), "1".to_owned()),
                ("x-a".to_owned(), String::new()),
                (
                    "content-type".to_owned(),
                    "text/plain;a=1\u{fffd}".to_owned()
                ),
            ]
        );
        assert_eq!(flat.get(&http::header::CONTENT_TYPE), Some(&source[..15]));
        assert!(!flat.contains(&http::header::CONTENT_LENGTH));
        drop(map);
        assert!(
            source.is_unique(),
            "the record holds no slice of the source"
        );
        assert_eq!(FlatHeaders::default().iter().count(), 0);
    }

    fn offer_many(store: &Arc<Captures>, count: u64) {
        for id in 0..count {
            let request = request(b"");
            let capture = Capture::start(
                Arc::clone(store),
                id,
                &request,
                "app",
                "h",
                "192.0.2.1".parse().unwrap(),
                false,
                tokio::time::Instant::now(),
                0,
            );
            drop(capture.finish(http::Response::new(crate::http::empty()), &[]));
        }
    }

    fn dropped(store: &Captures) -> String {
        let text = store.telemetry.metrics.encode();
        text.lines()
            .find(|l| l.starts_with("warren_http_captures_dropped_total"))
            .unwrap_or_default()
            .to_owned()
    }

    #[tokio::test]
    async fn a_full_queue_moves_into_the_rings_and_the_ring_keeps_the_newest() {
        let store = captures();
        offer_many(&store, QUEUE as u64 + 10);
        assert_eq!(dropped(&store), "warren_http_captures_dropped_total 0");
        let listed = store.list(Some("app"));
        assert_eq!(listed.len(), RING_PER_SERVICE);
        assert_eq!(listed[0].id, QUEUE as u64 + 9, "newest first");
    }

    #[tokio::test]
    async fn a_full_queue_drops_captures_while_the_rings_are_busy() {
        let store = captures();
        let busy = store.rings.lock().unwrap();
        offer_many(&store, QUEUE as u64 + 10);
        drop(busy);
        assert_eq!(dropped(&store), "warren_http_captures_dropped_total 10");
    }
}
