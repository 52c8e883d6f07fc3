//! `/api/v1/events`: the one Server-Sent Events stream that keeps the dashboard live.
//!
//! A stream starts with `hello` (version, side, start time: a page that sees `started`
//! change knows the process restarted and refetches everything), then sends every
//! [`TICK`]:
//! - `tick`: totals, rates over the last tick and per-service counters;
//! - `request`: each HTTP request captured since the last tick (at most
//!   [`REQUESTS_PER_TICK`]);
//!
//! and, as they happen, `log`: each new log event. Each stream is one task that reads
//! snapshots (never a lock the data path holds for long) and ends when the browser goes
//! away, the side stops, or the stream falls too far behind. At most [`MAX_STREAMS`] run
//! at once.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, broadcast, mpsc};

use super::{ApiError, Ctx, Page, status_info};
use crate::metrics::unix_millis_now;

/// How often `tick` is sent (the page's numbers lag by at most this plus its drawing).
pub const TICK: Duration = Duration::from_secs(1);
/// Event streams open at once (each is one task).
pub const MAX_STREAMS: usize = 32;
/// Services described per tick (by name); the Services page pages through the rest.
pub const SERVICES_PER_TICK: usize = 1000;
/// Captured requests announced per tick.
pub const REQUESTS_PER_TICK: usize = 200;
/// Events queued for a slow browser before the stream ends (it reconnects and starts
/// fresh).
const QUEUE: usize = 64;

/// `tick`'s data.
#[derive(Debug, Clone, Serialize)]
pub struct Tick {
    /// Milliseconds since the Unix epoch.
    pub t: u64,
    /// Live sessions.
    pub sessions: usize,
    /// Configured services.
    pub services: usize,
    /// Connections being relayed now.
    pub connections: i64,
    /// Bytes visitor → target since start, all services.
    pub bytes_in: u64,
    /// Bytes target → visitor since start, all services.
    pub bytes_out: u64,
    /// Bytes per second visitor → target over the last tick.
    pub rate_in: f64,
    /// Bytes per second target → visitor over the last tick.
    pub rate_out: f64,
    /// HTTP requests (`None` on a side without HTTP services).
    pub http: Option<HttpTick>,
    /// The first [`SERVICES_PER_TICK`] services by name.
    pub service_rates: Vec<ServiceTick>,
    /// The newest captured request's id.
    pub latest_request: Option<u64>,
}

/// HTTP totals and rates of one tick.
#[derive(Debug, Clone, Serialize)]
pub struct HttpTick {
    /// Requests answered since start.
    pub requests: u64,
    /// Of them, answered with a 5xx status.
    pub errors: u64,
    /// Of them, answered with a 4xx status.
    pub client_errors: u64,
    /// Requests per second over the last tick.
    pub rps: f64,
    /// Share of the last tick's requests answered with 5xx (0 when there were none).
    pub error_rate: f64,
}

/// One service in a tick.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceTick {
    /// The service name.
    pub name: String,
    /// As in `/api/v1/services`.
    pub state: &'static str,
    /// Connections being relayed now.
    pub active_connections: i64,
    /// Connections since start.
    pub total_connections: u64,
    /// Bytes visitor → target since start.
    pub bytes_in: u64,
    /// Bytes target → visitor since start.
    pub bytes_out: u64,
    /// Bytes per second visitor → target over the last tick.
    pub rate_in: f64,
    /// Bytes per second target → visitor over the last tick.
    pub rate_out: f64,
    /// Failed connections.
    pub errors: u64,
}

/// What the previous tick saw, to turn totals into rates.
#[derive(Debug, Default)]
struct Previous {
    t: u64,
    bytes: (u64, u64),
    services: HashMap<String, (u64, u64)>,
    http: (u64, u64),
    request: u64,
}

/// `GET /api/v1/events`.
pub(super) async fn events(State(ctx): State<Arc<Ctx>>) -> Response {
    let Ok(permit) = Arc::clone(&ctx.streams).try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(ApiError {
                error: format!(
                    "{MAX_STREAMS} event streams are open already: close a dashboard tab"
                ),
            }),
        )
            .into_response();
    };
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(feed(ctx, tx, permit));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|event| (Ok::<_, Infallible>(event), rx))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// Fills one stream until its browser goes away or the side stops.
async fn feed(ctx: Arc<Ctx>, tx: mpsc::Sender<Event>, _permit: OwnedSemaphorePermit) {
    let mut logs = super::logs::logs().subscribe();
    let hello =
        json_event("hello", &status_info(ctx.source.as_ref())).retry(Duration::from_secs(1));
    if tx.send(hello).await.is_err() {
        return;
    }
    let mut previous = Previous {
        // Announce only what happens from now on; the page fetched the list itself.
        request: ctx
            .source
            .captures()
            .and_then(|c| c.list(None).first().map(|r| r.id))
            .unwrap_or(0),
        ..Previous::default()
    };
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let events = tokio::select! {
            () = ctx.cancel.cancelled() => return,
            () = tx.closed() => return,
            _ = ticks.tick() => tick_events(&ctx, &mut previous),
            entry = logs.recv() => match entry {
                Ok(entry) => vec![json_event("log", entry.as_ref())],
                // Fell behind the log feed: skip ahead rather than end the stream.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        for event in events {
            // A browser that does not read ends its stream instead of queueing without
            // bound; EventSource reconnects by itself.
            if tx.try_send(event).is_err() {
                return;
            }
        }
    }
}

/// The `tick` of now and the `request` events since the last one.
fn tick_events(ctx: &Ctx, previous: &mut Previous) -> Vec<Event> {
    let source = ctx.source.as_ref();
    let t = unix_millis_now();
    let seconds = if previous.t == 0 {
        0.0
    } else {
        (t.saturating_sub(previous.t)) as f64 / 1000.0
    };
    let rate = |now: u64, before: u64| {
        if seconds > 0.0 {
            now.saturating_sub(before) as f64 / seconds
        } else {
            0.0
        }
    };
    let all = source.services(Page {
        offset: 0,
        limit: super::MAX_PAGE,
    });
    let (bytes_in, bytes_out, connections) = all.items.iter().fold((0, 0, 0), |acc, s| {
        (
            acc.0 + s.bytes_in,
            acc.1 + s.bytes_out,
            acc.2 + s.active_connections,
        )
    });
    let mut seen = HashMap::with_capacity(all.items.len().min(SERVICES_PER_TICK));
    let service_rates = all
        .items
        .iter()
        .take(SERVICES_PER_TICK)
        .map(|s| {
            let before = previous
                .services
                .get(&s.name)
                .copied()
                .unwrap_or((s.bytes_in, s.bytes_out));
            seen.insert(s.name.clone(), (s.bytes_in, s.bytes_out));
            ServiceTick {
                name: s.name.clone(),
                state: s.state,
                active_connections: s.active_connections,
                total_connections: s.total_connections,
                bytes_in: s.bytes_in,
                bytes_out: s.bytes_out,
                rate_in: rate(s.bytes_in, before.0),
                rate_out: rate(s.bytes_out, before.1),
                errors: s.errors,
            }
        })
        .collect();
    let captures = source.captures();
    let http = captures.map(|_| {
        let totals = source.telemetry().metrics.http_totals();
        let [_, _, _, client_errors, errors] = totals;
        let requests = totals.iter().sum::<u64>();
        let (requests_before, errors_before) = if previous.t == 0 {
            (requests, errors)
        } else {
            previous.http
        };
        let new_requests = requests.saturating_sub(requests_before);
        let new_errors = errors.saturating_sub(errors_before);
        previous.http = (requests, errors);
        HttpTick {
            requests,
            errors,
            client_errors,
            rps: rate(requests, requests_before),
            error_rate: if new_requests == 0 {
                0.0
            } else {
                new_errors as f64 / new_requests as f64
            },
        }
    });
    let new_requests = captures
        .map(|c| c.since(previous.request, REQUESTS_PER_TICK))
        .unwrap_or_default();
    if let Some(last) = new_requests.last() {
        previous.request = previous.request.max(last.id);
    }
    let tick = Tick {
        t,
        sessions: source
            .sessions(Page {
                offset: 0,
                limit: 0,
            })
            .total,
        services: all.total,
        connections,
        bytes_in,
        bytes_out,
        rate_in: rate(
            bytes_in,
            if previous.t == 0 {
                bytes_in
            } else {
                previous.bytes.0
            },
        ),
        rate_out: rate(
            bytes_out,
            if previous.t == 0 {
                bytes_out
            } else {
                previous.bytes.1
            },
        ),
        http,
        service_rates,
        latest_request: (previous.request > 0).then_some(previous.request),
    };
    previous.t = t;
    previous.bytes = (bytes_in, bytes_out);
    previous.services = seen;
    let mut events = Vec::with_capacity(1 + new_requests.len());
    events.push(json_event("tick", &tick));
    events.extend(new_requests.iter().map(|r| json_event("request", r)));
    events
}

fn json_event(name: &str, data: &impl Serialize) -> Event {
    let event = Event::default().event(name);
    match event.clone().json_data(data) {
        Ok(event) => event,
        // Our own types always serialize; say so rather than send a broken event.
        Err(error) => event.data(format!("{{\"error\":\"{error}\"}}")),
    }
}
