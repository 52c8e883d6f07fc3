//! `access_log`: one line per request, written when the response has been sent (or has
//! failed), so it can say how many bytes went out and how long the whole exchange took.
//!
//! Put it first in the chain: a middleware only sees the responses of requests its
//! `on_request` saw, so a log listed first also records the 401s, 429s and redirects the
//! middleware after it gave.
//!
//! # Formats
//!
//! * `json`: one object per line: `time`, `id`, `client_ip`, `method`, `host`, `target`
//!   (path and query as sent), `version`, `status`, `bytes` (response body bytes sent),
//!   `duration_ms`, `completed` (false when the body was cut off), `service`, `referer`,
//!   `user_agent`, and `decisions` (what each middleware decided).
//! * `combined`: Apache's combined format, followed (as Traefik does) by the host, the
//!   service and the duration: `IP - - [time] "GET /x HTTP/1.1" 200 512 "referer" "agent"
//!   "host" "service" 12ms`.
//!
//! # Where lines go
//!
//! By default to `tracing` (target `warren::access`, level info), so they follow the
//! process's log settings. With `file`, lines are appended to that file by one writer
//! thread fed through a bounded queue of [`QUEUE_LEN`] lines; when the disk cannot keep
//! up, lines are dropped (and counted, see [`AccessLog::dropped`]) rather than slowing
//! requests. The thread ends when the chain that owns the log is dropped (a reload), after
//! writing what is queued. A blocking thread rather than a tokio task, since file writes
//! block; it needs no runtime to be built.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write as _};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::{Duration, SystemTime};

use http::header::{REFERER, USER_AGENT};
use http::{Request, Response, Version};

use super::{BoxFuture, Flow, Middleware, RequestContext};
use crate::http::{Body, empty};

/// Lines waiting for the file writer before new ones are dropped.
pub const QUEUE_LEN: usize = 4096;

/// The longest request target, referer or user agent logged (longer ones are cut).
const MAX_FIELD_LEN: usize = 2048;

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    Json,
    /// Apache combined, plus host, service and duration.
    Combined,
}

/// The `access_log` middleware.
pub struct AccessLog {
    format: Format,
    output: Arc<Output>,
}

impl AccessLog {
    /// Lines in `format` to `tracing` (target `warren::access`), or appended to `file`.
    ///
    /// # Errors
    /// The file cannot be opened for appending, or the writer thread cannot start.
    pub fn new(format: Format, file: Option<&Path>) -> Result<AccessLog, String> {
        let output = match file {
            None => Output::Tracing,
            Some(path) => Output::File(FileWriter::open(path)?),
        };
        Ok(AccessLog {
            format,
            output: Arc::new(output),
        })
    }

    /// Lines dropped because the file writer fell behind (always 0 without a file).
    pub fn dropped(&self) -> u64 {
        match &*self.output {
            Output::File(writer) => writer.dropped.load(Ordering::Relaxed),
            _ => 0,
        }
    }
}

impl Middleware for AccessLog {
    fn name(&self) -> &str {
        "access_log"
    }

    fn on_request<'a>(
        &'a self,
        request: &'a mut Request<Body>,
        cx: &'a mut RequestContext,
    ) -> BoxFuture<'a, Flow> {
        let header = |name| {
            request
                .headers()
                .get(name)
                .map(|value| cut(&String::from_utf8_lossy(value.as_bytes())))
        };
        let line = RequestLine {
            time: SystemTime::now(),
            method: request.method().to_string(),
            target: cut(request
                .uri()
                .path_and_query()
                .map_or("/", |path| path.as_str())),
            version: request.version(),
            referer: header(REFERER),
            user_agent: header(USER_AGENT),
        };
        cx.extensions.insert(line);
        Box::pin(std::future::ready(Flow::Continue))
    }

    fn on_response(&self, response: &mut Response<Body>, cx: &RequestContext) {
        let line = cx
            .extensions
            .get::<RequestLine>()
            .cloned()
            .unwrap_or_else(|| RequestLine {
                time: SystemTime::now(),
                method: "-".to_owned(),
                target: "-".to_owned(),
                version: Version::HTTP_11,
                referer: None,
                user_agent: None,
            });
        let entry = Entry {
            line,
            id: cx.id,
            client_ip: cx.client_ip,
            host: cx.host.clone(),
            service: cx.service.to_string(),
            status: response.status().as_u16(),
            decisions: cx.decisions.clone(),
            started: cx.started,
        };
        let body = std::mem::replace(response.body_mut(), empty());
        let (format, output) = (self.format, Arc::clone(&self.output));
        *response.body_mut() = crate::http::body::observe(body, 0, move |end| {
            let duration = entry.started.elapsed();
            output.write(entry.render(format, end.bytes, end.completed, duration));
        });
    }
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

/// What `on_request` keeps for the log line.
#[derive(Debug, Clone)]
struct RequestLine {
    time: SystemTime,
    method: String,
    target: String,
    version: Version,
    referer: Option<String>,
    user_agent: Option<String>,
}

/// Everything of a line but the body's fate.
#[derive(Debug)]
struct Entry {
    line: RequestLine,
    id: u64,
    client_ip: IpAddr,
    host: String,
    service: String,
    status: u16,
    decisions: Vec<(String, String)>,
    started: tokio::time::Instant,
}

impl Entry {
    fn render(&self, format: Format, bytes: u64, completed: bool, duration: Duration) -> String {
        let millis = duration.as_secs_f64() * 1000.0;
        match format {
            Format::Json => serde_json::json!({
                "time": rfc3339(self.line.time),
                "id": self.id,
                "client_ip": self.client_ip.to_string(),
                "method": self.line.method,
                "host": self.host,
                "target": self.line.target,
                "version": format!("{:?}", self.line.version),
                "status": self.status,
                "bytes": bytes,
                "duration_ms": (millis * 1000.0).round() / 1000.0,
                "completed": completed,
                "service": self.service,
                "referer": self.line.referer,
                "user_agent": self.line.user_agent,
                "decisions": self.decisions.iter().map(|(middleware, outcome)| {
                    serde_json::json!({ "middleware": middleware, "outcome": outcome })
                }).collect::<Vec<_>>(),
            })
            .to_string(),
            Format::Combined => {
                let quoted = |text: Option<&str>| quote(text.unwrap_or("-"));
                format!(
                    "{} - - [{}] \"{} {} {:?}\" {} {} {} {} {} {} {}ms",
                    self.client_ip,
                    clf_time(self.line.time),
                    escape(&self.line.method),
                    escape(&self.line.target),
                    self.line.version,
                    self.status,
                    if bytes == 0 {
                        "-".to_owned()
                    } else {
                        bytes.to_string()
                    },
                    quoted(self.line.referer.as_deref()),
                    quoted(self.line.user_agent.as_deref()),
                    quote(&self.host),
                    quote(&self.service),
                    millis.round() as u64,
                )
            }
        }
    }
}

/// Where lines go.
enum Output {
    Tracing,
    File(FileWriter),
    /// Tests: lines collected in memory.
    #[cfg(test)]
    Memory(std::sync::Mutex<Vec<String>>),
}

impl Output {
    fn write(&self, line: String) {
        match self {
            Output::Tracing => tracing::info!(target: "warren::access", "{line}"),
            Output::File(writer) => writer.send(line),
            #[cfg(test)]
            Output::Memory(lines) => lines
                .lock()
                .unwrap_or_else(|poison| poison.into_inner())
                .push(line),
        }
    }
}

/// The sending side of the file writer thread.
struct FileWriter {
    queue: SyncSender<String>,
    path: PathBuf,
    dropped: Arc<AtomicU64>,
}

impl FileWriter {
    /// Opens `path` for appending and starts its writer thread.
    fn open(path: &Path) -> Result<FileWriter, String> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|error| format!("cannot open access log {}: {error}", path.display()))?;
        let (writer, queue) = FileWriter::with_queue(path, QUEUE_LEN);
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("warren-access-log".to_owned())
            .spawn(move || write_lines(file, queue, &shown))
            .map_err(|error| format!("cannot start the access log writer: {error}"))?;
        Ok(writer)
    }

    /// A writer whose queue of `capacity` lines is drained by whoever holds the receiver.
    fn with_queue(path: &Path, capacity: usize) -> (FileWriter, Receiver<String>) {
        let (queue, lines) = std::sync::mpsc::sync_channel(capacity);
        let writer = FileWriter {
            queue,
            path: path.to_owned(),
            dropped: Arc::new(AtomicU64::new(0)),
        };
        (writer, lines)
    }

    /// Queues `line`, or drops and counts it if the queue is full.
    fn send(&self, line: String) {
        match self.queue.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                // Warn on the 1st, 2nd, 4th, 8th... drop: visible, never a flood.
                if dropped.is_power_of_two() {
                    tracing::warn!(
                        event = "access_log_dropped",
                        file = %self.path.display(),
                        dropped,
                        "access log lines dropped: the file cannot keep up"
                    );
                }
            }
        }
    }
}

/// The writer thread: appends lines until every sender is gone, flushing whenever the
/// queue runs empty.
fn write_lines(file: File, lines: Receiver<String>, path: &str) {
    let mut out = BufWriter::new(file);
    let mut failed = false;
    while let Ok(line) = lines.recv() {
        let mut result = writeln!(out, "{line}");
        while let Ok(more) = lines.try_recv() {
            result = result.and_then(|()| writeln!(out, "{more}"));
        }
        result = result.and_then(|()| out.flush());
        match result {
            Err(error) if !failed => {
                failed = true;
                tracing::error!(event = "access_log_write_failed", file = path, %error, "cannot write the access log");
            }
            Ok(()) => failed = false,
            Err(_) => {}
        }
    }
}

/// `text` cut to [`MAX_FIELD_LEN`] bytes (on a character boundary).
fn cut(text: &str) -> String {
    let mut end = text.len().min(MAX_FIELD_LEN);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// `text` in double quotes, with `"`, `\` and control characters escaped.
fn quote(text: &str) -> String {
    format!("\"{}\"", escape(text))
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// `2026-05-01T12:34:56.789Z`.
fn rfc3339(time: SystemTime) -> String {
    let t = time::OffsetDateTime::from(time);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// `01/May/2026:12:34:56 +0000`.
fn clf_time(time: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let t = time::OffsetDateTime::from(time);
    let month = MONTHS
        .get(usize::from(u8::from(t.month())).saturating_sub(1))
        .copied()
        .unwrap_or("Jan");
    format!(
        "{:02}/{month}/{:04}:{:02}:{:02}:{:02} +0000",
        t.day(),
        t.year(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;
    use crate::http::middleware::testing::{body_text, context, get, run};

    fn memory_log(format: Format) -> AccessLog {
        AccessLog {
            format,
            output: Arc::new(Output::Memory(std::sync::Mutex::default())),
        }
    }

    fn lines(log: &AccessLog) -> Vec<String> {
        match &*log.output {
            Output::Memory(lines) => lines.lock().expect("not poisoned").clone(),
            _ => Vec::new(),
        }
    }

    #[tokio::test]
    async fn json_line_written_when_the_body_ends() {
        let log = memory_log(Format::Json);
        let mut request = get("/a?b=c");
        request
            .headers_mut()
            .insert(USER_AGENT, http::HeaderValue::from_static("curl/8"));
        let mut cx = context();
        assert!(run(&log, &mut request, &mut cx).await.is_none());
        cx.decide("basic_auth", "user \"alice\"");
        let mut response = Response::new(crate::http::full("hello"));
        *response.status_mut() = StatusCode::CREATED;
        log.on_response(&mut response, &cx);
        assert!(lines(&log).is_empty(), "nothing before the body is sent");
        assert_eq!(body_text(response).await, "hello");
        let written = lines(&log);
        assert_eq!(written.len(), 1);
        let value: serde_json::Value = serde_json::from_str(&written[0]).expect("json");
        assert_eq!(value["method"], "GET");
        assert_eq!(value["host"], "example.com");
        assert_eq!(value["target"], "/a?b=c");
        assert_eq!(value["status"], 201);
        assert_eq!(value["bytes"], 5);
        assert_eq!(value["completed"], true);
        assert_eq!(value["client_ip"], "203.0.113.7");
        assert_eq!(value["service"], "web");
        assert_eq!(value["user_agent"], "curl/8");
        assert_eq!(value["decisions"][0]["middleware"], "basic_auth");
        assert!(value["duration_ms"].is_number());
        assert!(value["time"].as_str().is_some_and(|t| t.ends_with('Z')));
    }

    #[tokio::test]
    async fn combined_line_and_a_dropped_body() {
        let log = memory_log(Format::Combined);
        let mut request = get("/x");
        request
            .headers_mut()
            .insert(USER_AGENT, http::HeaderValue::from_static("a\"b"));
        let mut cx = context();
        assert!(run(&log, &mut request, &mut cx).await.is_none());
        let mut response = Response::new(crate::http::full("unsent"));
        log.on_response(&mut response, &cx);
        drop(response);
        let written = lines(&log);
        assert_eq!(written.len(), 1, "logged on drop");
        let line = &written[0];
        assert!(line.starts_with("203.0.113.7 - - ["), "{line}");
        assert!(
            line.contains("\"GET /x HTTP/1.1\" 200 - \"-\" \"a\\\"b\" \"example.com\" \"web\" "),
            "{line}"
        );
        assert!(line.ends_with("ms"), "{line}");
    }

    #[tokio::test]
    async fn an_empty_body_is_logged_once() {
        let log = memory_log(Format::Json);
        let mut cx = context();
        assert!(run(&log, &mut get("/"), &mut cx).await.is_none());
        let mut response = Response::new(crate::http::empty());
        log.on_response(&mut response, &cx);
        assert_eq!(body_text(response).await, "");
        let written = lines(&log);
        assert_eq!(written.len(), 1);
        assert!(written[0].contains("\"completed\":true"), "{}", written[0]);
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let (writer, queue) = FileWriter::with_queue(Path::new("/dev/null"), 2);
        for i in 0..5 {
            writer.send(format!("line {i}"));
        }
        assert_eq!(writer.dropped.load(Ordering::Relaxed), 3);
        assert_eq!(queue.try_iter().collect::<Vec<_>>(), ["line 0", "line 1"]);
    }

    #[tokio::test]
    async fn lines_reach_the_file() {
        let dir = std::env::temp_dir().join(format!(
            "warren-access-log-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("access.log");
        let log = AccessLog::new(Format::Json, Some(&path)).expect("opens");
        for _ in 0..3 {
            let mut cx = context();
            assert!(run(&log, &mut get("/"), &mut cx).await.is_none());
            let mut response = Response::new(crate::http::full("x"));
            log.on_response(&mut response, &cx);
            assert_eq!(body_text(response).await, "x");
        }
        assert_eq!(log.dropped(), 0);
        // Dropping the log ends the writer after it wrote the queue.
        drop(log);
        let mut text = String::new();
        for _ in 0..200 {
            text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().count() == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(text.lines().count(), 3, "{text}");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(AccessLog::new(Format::Json, Some(&dir.join("missing/dir/log"))).is_err());
    }
}
