//! Address discovery: the server's STUN Binding responder ([`Reflector`], [`serve`]) and
//! the peer's question to it ([`discover`]).
//!
//! The reflector answers each Binding request with the address it came from
//! (XOR-MAPPED-ADDRESS) and nothing else: no integrity (the answer is public knowledge to
//! whoever sent the request), no state per request. Each source IP gets a small token
//! bucket in a bounded table, so the reflector cannot be used to amplify (an answer is
//! about as long as the request) or to flood; everything that is not a Binding request,
//! and every request over the limit, is dropped in silence.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use thiserror::Error;
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use warren_proto::stun::{self, Class, Message};

use super::StunIo;

/// Limits of the reflector.
#[derive(Debug, Clone)]
pub struct ReflectorConfig {
    /// Requests answered per second per source IP, sustained.
    pub per_ip_rate: f64,
    /// Requests answered in a burst per source IP.
    pub per_ip_burst: f64,
    /// Source IPs tracked at once; when full and none is idle, new sources are not
    /// answered (fail closed).
    pub max_sources: usize,
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        // A peer asks once or twice per transfer (with retries); 10 per second with a
        // burst of 20 leaves room for NAT-type probes and many peers behind one address.
        Self {
            per_ip_rate: 10.0,
            per_ip_burst: 20.0,
            max_sources: 4096,
        }
    }
}

/// The sans-IO part of the reflector: a request in, maybe an answer out.
#[derive(Debug)]
pub struct Reflector {
    config: ReflectorConfig,
    buckets: HashMap<IpAddr, Bucket>,
    /// Requests dropped by the rate limit.
    pub limited: u64,
    /// Datagrams that were not Binding requests.
    pub ignored: u64,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Reflector {
    /// A reflector with these limits.
    pub fn new(config: ReflectorConfig) -> Self {
        Self {
            buckets: HashMap::with_capacity(config.max_sources.min(1024)),
            config,
            limited: 0,
            ignored: 0,
        }
    }

    /// The answer to a datagram from `from`, if it deserves one.
    pub fn handle(&mut self, now: Instant, from: SocketAddr, packet: &[u8]) -> Option<Vec<u8>> {
        let request = match stun::decode(packet) {
            Ok(d) if d.message.class == Class::Request => d.message,
            _ => {
                self.ignored += 1;
                return None;
            }
        };
        if !self.admit(now, from.ip()) {
            self.limited += 1;
            return None;
        }
        let mut out = Vec::with_capacity(32);
        Message::success(request.transaction, from).encode(&mut out);
        Some(out)
    }

    /// Takes a token from `ip`'s bucket.
    fn admit(&mut self, now: Instant, ip: IpAddr) -> bool {
        let ReflectorConfig {
            per_ip_rate: rate,
            per_ip_burst: burst,
            max_sources,
        } = self.config;
        if !self.buckets.contains_key(&ip) && self.buckets.len() >= max_sources {
            // Forget the sources whose bucket has refilled: they are as good as new.
            let full_after = Duration::from_secs_f64(burst / rate.max(f64::MIN_POSITIVE));
            self.buckets
                .retain(|_, b| now.saturating_duration_since(b.last) < full_after);
            if self.buckets.len() >= max_sources {
                return false;
            }
        }
        let bucket = self.buckets.entry(ip).or_insert(Bucket {
            tokens: burst,
            last: now,
        });
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(burst);
        bucket.last = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Source IPs tracked now.
    pub fn sources(&self) -> usize {
        self.buckets.len()
    }
}

/// Runs a reflector on `socket` until `cancel` fires.
///
/// # Errors
///
/// The socket fails to receive (sending errors are ignored: the peer asks again).
pub async fn serve(
    socket: &UdpSocket,
    config: ReflectorConfig,
    cancel: CancellationToken,
) -> io::Result<()> {
    serve_with(socket, None, config, cancel).await
}

/// Runs the second reflector of a server (its other port, for NAT-type probes) on
/// `socket` until `cancel` fires: a request with WARREN-CHANGE-PORT is answered from
/// `main`, the server's P2P port, instead.
///
/// # Errors
///
/// As [`serve`].
pub async fn serve_alt(
    socket: &UdpSocket,
    main: &UdpSocket,
    config: ReflectorConfig,
    cancel: CancellationToken,
) -> io::Result<()> {
    serve_with(socket, Some(main), config, cancel).await
}

async fn serve_with(
    socket: &UdpSocket,
    other: Option<&UdpSocket>,
    config: ReflectorConfig,
    cancel: CancellationToken,
) -> io::Result<()> {
    let mut reflector = Reflector::new(config);
    let mut buf = vec![0u8; stun::MAX_MESSAGE_LEN + 1];
    loop {
        let (len, from) = tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            r = socket.recv_from(&mut buf) => match r {
                Ok(r) => r,
                // ICMP errors from earlier answers surface here on some systems: not ours
                // to stop for.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused
                    || e.kind() == io::ErrorKind::ConnectionReset => continue,
                Err(e) => return Err(e),
            },
        };
        if let Some(answer) = reflector.handle(Instant::now(), from, &buf[..len]) {
            let change =
                other.filter(|_| stun::decode(&buf[..len]).is_ok_and(|d| d.message.change_port));
            let _ = change.unwrap_or(socket).try_send_to(&answer, from);
        }
    }
}

/// How [`discover`] asks.
#[derive(Debug, Clone)]
pub struct DiscoverConfig {
    /// First wait for an answer; doubled after each try.
    pub first_wait: Duration,
    /// Give up after this long in total.
    pub timeout: Duration,
}

impl Default for DiscoverConfig {
    fn default() -> Self {
        // Retransmits at 0, 100, 300, 700, 1500 ms: enough for a lossy path, and a
        // reflector that answers nothing in 2 s is not worth waiting for (the host
        // candidates and the relay still work).
        Self {
            first_wait: Duration::from_millis(100),
            timeout: Duration::from_secs(2),
        }
    }
}

/// Why [`discover`] found no address.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DiscoverError {
    /// No answer in time.
    #[error(
        "the address reflector at {reflector} did not answer in {waited:?} ({tries} requests); \
         check that the server enables [server.p2p] and that UDP to it is not blocked"
    )]
    Timeout {
        /// Who was asked.
        reflector: SocketAddr,
        /// How long.
        waited: Duration,
        /// How many requests went out.
        tries: u32,
    },
    /// The socket failed.
    #[error("cannot ask the address reflector at {reflector}: {source}")]
    Io {
        /// Who was asked.
        reflector: SocketAddr,
        /// The socket's error.
        source: io::Error,
    },
}

/// Asks the reflector at `reflector` which address this socket's datagrams come from (the
/// NAT's mapping towards the server), retrying with backoff until `config.timeout`.
/// STUN datagrams that are not the answer are discarded.
///
/// # Errors
///
/// [`DiscoverError`]: no answer in time, or the socket failed.
pub async fn discover<S: StunIo>(
    io: &mut S,
    reflector: SocketAddr,
    config: &DiscoverConfig,
) -> Result<SocketAddr, DiscoverError> {
    let transaction: stun::TransactionId = rand::random();
    let mut request = Vec::with_capacity(stun::HEADER_LEN);
    Message::request(transaction).encode(&mut request);
    let io_error = |source| DiscoverError::Io { reflector, source };
    let start = Instant::now();
    let deadline = start + config.timeout;
    let mut wait = config.first_wait;
    let mut tries = 0u32;
    loop {
        // Bounded by the deadline: a socket that stays full is the retransmit's problem.
        let _ = tokio::time::timeout_at(deadline, io.writable()).await;
        io.send_to(&request, reflector).map_err(io_error)?;
        tries += 1;
        let resend = (Instant::now() + wait).min(deadline);
        wait = wait.saturating_mul(2);
        loop {
            let (packet, from) = tokio::select! {
                r = io.recv_from() => r.map_err(io_error)?,
                () = tokio::time::sleep_until(resend) => break,
            };
            let Ok(decoded) = stun::decode(&packet) else {
                continue;
            };
            let m = decoded.message;
            if let (true, Some(mapped)) = (
                from == reflector && m.class == Class::Success && m.transaction == transaction,
                m.mapped,
            ) {
                return Ok(mapped);
            }
        }
        if Instant::now() >= deadline {
            return Err(DiscoverError::Timeout {
                reflector,
                waited: start.elapsed(),
                tries,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rate_limit_and_bounded_table() {
        let mut r = Reflector::new(ReflectorConfig {
            per_ip_rate: 1.0,
            per_ip_burst: 2.0,
            max_sources: 2,
        });
        let mut req = Vec::new();
        Message::request([3; 12]).encode(&mut req);
        let now = Instant::now();
        let a: SocketAddr = "192.0.2.1:1".parse().unwrap();
        assert!(r.handle(now, a, &req).is_some());
        assert!(r.handle(now, a, &req).is_some());
        assert!(r.handle(now, a, &req).is_none(), "burst spent");
        assert!(
            r.handle(now + Duration::from_secs(1), a, &req).is_some(),
            "refilled"
        );
        let b: SocketAddr = "192.0.2.2:1".parse().unwrap();
        let c: SocketAddr = "192.0.2.3:1".parse().unwrap();
        assert!(r.handle(now, b, &req).is_some());
        assert!(r.handle(now, c, &req).is_none(), "table full");
        assert_eq!(r.sources(), 2);
        // Later, idle sources are forgotten and a new one fits.
        assert!(r.handle(now + Duration::from_secs(10), c, &req).is_some());
        assert!(r.sources() <= 2);
        assert!(r.handle(now, a, b"not stun").is_none());
        assert_eq!(r.ignored, 1);
    }
}
