//! Target health checks (frp's `healthCheck`): while a service's local target fails its
//! check, the client withdraws the service from every session (the servers stop picking
//! this client for its visitors) and offers it again when the target recovers.
//!
//! One task per checked service probes the target every `interval` (a TCP connect, or an
//! HTTP `GET path` answered 2xx/3xx), each probe under `timeout`. `failures` consecutive
//! failures mark the target down, as many consecutive passes mark it up again, so one
//! dropped probe never flaps the service. Transitions are logged, counted
//! (`warren_health_checks_total`) and sent to every session as `Health` messages; a session
//! established later claims the service with its state at that moment. A target counts as
//! up until its checks say otherwise.
//!
//! The task reads the check from the config in force on every round, so a reload that
//! changes it applies at the next probe, one that removes it ends the task (and offers the
//! service again), and one that adds it starts a task ([`start_checks`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{info, warn};
use warren_proto::message;

use super::{ClientSession, Shared};
use crate::config::HostPort;
use crate::config::ha::{HealthCheck, HealthProbe};
use crate::transport::tcp;

/// Longest status line an HTTP check reads.
const MAX_STATUS_LINE: usize = 1024;

/// The targets' health: services with a check and whether their target is up.
#[derive(Debug, Default)]
pub(super) struct Board {
    states: Mutex<HashMap<String, bool>>,
    /// Services whose check task runs.
    running: Mutex<HashSet<String>>,
}

impl Board {
    /// Whether the target of `service` is up (true while unchecked).
    pub(super) fn is_up(&self, service: &str) -> bool {
        self.states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(service)
            .copied()
            .unwrap_or(true)
    }

    /// `up`, `down` or `unchecked`, for the admin API.
    pub(super) fn state(&self, service: &str) -> &'static str {
        match self
            .states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(service)
        {
            Some(true) => "up",
            Some(false) => "down",
            None => "unchecked",
        }
    }

    fn set(&self, service: &str, up: Option<bool>) {
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        match up {
            Some(up) => states.insert(service.to_owned(), up),
            None => states.remove(service),
        };
    }
}

/// Starts a check task for every service of the config in force that has a check and no
/// task yet.
pub(super) fn start_checks(shared: &Arc<Shared>) {
    let config = shared.config();
    for service in config.services.values() {
        if service.health_check.is_none() {
            continue;
        }
        let fresh = shared
            .health
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(service.name.clone());
        if fresh {
            shared
                .tasks
                .spawn(run_check(Arc::clone(shared), service.name.clone()));
        }
    }
}

/// Tells `session`'s server that these services' targets went down or up (best effort: a
/// full queue means a wedged session, which its heartbeat ends).
pub(super) fn report(session: &ClientSession, services: Vec<String>, up: bool) {
    for part in message::health_parts(services, up) {
        let _ = session.control.try_send(part);
    }
}

/// Checks one service's target until the client stops or its check is removed.
async fn run_check(shared: Arc<Shared>, name: String) {
    let mut passes = 0u32;
    let mut failures = 0u32;
    while let Some((check, target)) = shared.config().services.get(&name).and_then(|service| {
        service
            .health_check
            .clone()
            .map(|check| (check, service.target.clone()))
    }) {
        let result = probe(&check, &target).await;
        match &result {
            Ok(()) => {
                passes = passes.saturating_add(1);
                failures = 0;
            }
            Err(_) => {
                failures = failures.saturating_add(1);
                passes = 0;
            }
        }
        let was_up = shared.health.is_up(&name);
        let now_up = if was_up {
            failures < check.failures
        } else {
            passes >= check.failures
        };
        if shared
            .health
            .states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&name)
            .is_none()
        {
            shared.health.set(&name, Some(now_up));
        }
        if now_up != was_up {
            transition(&shared, &name, now_up, result.err());
        }
        tokio::select! {
            () = shared.cancel.cancelled() => break,
            () = tokio::time::sleep(check.interval) => {}
        }
    }
    // No check any more: the service is offered as it is.
    if !shared.health.is_up(&name) {
        transition(&shared, &name, true, None);
    }
    shared.health.set(&name, None);
    shared
        .health
        .running
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&name);
}

/// Records and announces a change of `name`'s target health.
fn transition(shared: &Shared, name: &str, up: bool, error: Option<String>) {
    shared.health.set(name, Some(up));
    shared.telemetry.metrics.health_changed(name, up);
    if up {
        info!(event = "health_up", service = %name, "the service's target passes its health check again; offering it");
    } else {
        warn!(event = "health_down", service = %name, error = %error.unwrap_or_default(), "the service's target fails its health check; withdrawing it from the servers");
    }
    if !shared.offers(name) && up {
        // Draining: the service stays withdrawn.
        return;
    }
    for session in shared.sessions_now() {
        if session.services.contains(name) {
            report(&session, vec![name.to_owned()], up);
        }
    }
}

/// One probe of `target`.
async fn probe(check: &HealthCheck, target: &HostPort) -> Result<(), String> {
    let attempt = async {
        let mut stream = tcp::connect_preferring(target, check.timeout, tcp::Family::Any)
            .await
            .map_err(|e| format!("cannot connect to {target}: {e}"))?;
        match &check.probe {
            HealthProbe::Tcp => Ok(()),
            HealthProbe::Http { path } => http_get(&mut stream, target, path).await,
        }
    };
    tokio::time::timeout(check.timeout, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "no answer from {target} within {:?}",
                check.timeout
            ))
        })
}

/// `GET path` and a look at the status line: 2xx and 3xx pass. Written out rather than
/// taken from an HTTP client crate because a check needs one request and one bounded
/// line, nothing of a client's pooling or body handling.
async fn http_get(
    stream: &mut tokio::net::TcpStream,
    target: &HostPort,
    path: &str,
) -> Result<(), String> {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {target}\r\nUser-Agent: warren-health-check\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("cannot send the check request: {e}"))?;
    let mut line = Vec::with_capacity(64);
    let mut buf = [0u8; 256];
    while !line.contains(&b'\n') && line.len() < MAX_STATUS_LINE {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| format!("cannot read the answer: {e}"))?;
        if n == 0 {
            break;
        }
        line.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&line);
    let status = line.lines().next().unwrap_or_default();
    match status_code(status) {
        Some(code) if (200..400).contains(&code) => Ok(()),
        Some(code) => Err(format!("GET {path} answered {code}")),
        None => Err(format!(
            "GET {path}: not an HTTP answer ({:?})",
            truncate(status)
        )),
    }
}

/// The code of an HTTP/1.x status line.
fn status_code(line: &str) -> Option<u16> {
    let mut parts = line.split_whitespace();
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    parts.next()?.parse().ok()
}

fn truncate(text: &str) -> String {
    text.chars().take(64).collect()
}

/// For `warren doctor`: the current verdict of a service's check (`None`: no check).
pub(crate) async fn check_once(check: &HealthCheck, target: &HostPort) -> Result<(), String> {
    probe(check, target).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(status_code("HTTP/1.1 200 OK"), Some(200));
        assert_eq!(status_code("HTTP/1.0 503 Service Unavailable"), Some(503));
        assert_eq!(status_code("SSH-2.0-OpenSSH"), None);
        assert_eq!(status_code(""), None);
    }

    #[test]
    fn unchecked_services_count_as_up() {
        let board = Board::default();
        assert!(board.is_up("web"));
        assert_eq!(board.state("web"), "unchecked");
        board.set("web", Some(false));
        assert!(!board.is_up("web"));
        assert_eq!(board.state("web"), "down");
    }

    #[tokio::test]
    async fn probes_see_a_listener_and_its_absence() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let target = HostPort {
            host: "127.0.0.1".into(),
            port: addr.port(),
        };
        let server = tokio::spawn(async move {
            for _ in 0..2 {
                let (mut stream, _) = listener.accept().await.expect("accept");
                let mut buf = [0u8; 512];
                let _ = stream.read(&mut buf).await;
                let _ = stream.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await;
            }
            drop(listener);
        });
        let mut check = HealthCheck::tcp();
        assert_eq!(probe(&check, &target).await, Ok(()));
        check.probe = HealthProbe::Http {
            path: "/healthz".into(),
        };
        assert_eq!(probe(&check, &target).await, Ok(()));
        server.await.expect("server");
        let error = probe(&check, &target).await.expect_err("closed port");
        assert!(error.contains("cannot connect"), "{error}");
    }
}
