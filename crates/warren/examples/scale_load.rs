//! Load for the scale measurements (issue 21), driven by `bench/scale.py`: many in-process
//! clients against one server, or many concurrent visitor streams through one session.
//!
//! ```text
//! scale_load clients SERVER PSK TOKEN CLIENTS SERVICES TARGET HOLD_SECS
//!     CLIENTS clients, client i serving services c{i}s0 .. c{i}s{SERVICES-1} towards
//!     TARGET; started in small batches (the server admits at most 256 unauthenticated
//!     connections per source address, and each session opens a pool of data channels).
//!     Prints `ready SECONDS` once every session is up, then holds them HOLD_SECS.
//! scale_load streams SINK SECONDS COUNT VISITOR_ADDR...
//!     Listens on SINK (the client's target: counts the bytes of each stream), opens COUNT
//!     visitor connections spread over the VISITOR_ADDRs, each sending only its id until
//!     every stream reached the sink (`open N`); then all write as fast as they can at once.
//!     Prints `measuring`, then after SECONDS one JSON line with per-stream throughput (min,
//!     p10, median, max bytes/s; streams that got nothing), then stops.
//! ```
//!
//! Every wait has a timeout, every loop a bound, and everything stays on 127.0.0.1; the
//! process exits by itself. Built in release by `bench/scale.py`; not part of the library.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use warren::{Client, HostPort};

/// Clients started at once: each opens a control channel and a pool of data channels.
const CLIENT_BATCH: usize = 16;
/// How long all clients, or all streams, may take to come up.
const SETUP_TIMEOUT: Duration = Duration::from_secs(300);
/// Visitor connections opened at once.
const STREAM_BATCH: usize = 250;
/// How long one batch of streams may take to reach the sink.
const BATCH_TIMEOUT: Duration = Duration::from_secs(20);
/// Bytes per write of a visitor.
const CHUNK: usize = 16 * 1024;

fn usage() -> ExitCode {
    eprintln!(
        "usage: scale_load clients SERVER PSK TOKEN CLIENTS SERVICES TARGET HOLD_SECS\n       scale_load streams SINK SECONDS COUNT VISITOR_ADDR..."
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Descriptors: a session or a stream holds several; the hard limit is the ceiling.
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = match args.first().map(String::as_str) {
        Some("clients") if args.len() == 8 => runtime.block_on(clients(&args[1..])),
        Some("streams") if args.len() >= 5 => runtime.block_on(streams(&args[1..])),
        _ => return usage(),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("scale_load: {error}");
            ExitCode::FAILURE
        }
    }
}

fn parse<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{what}: cannot parse `{text}`"))
}

async fn clients(args: &[String]) -> Result<(), String> {
    let server: SocketAddr = parse("SERVER", &args[0])?;
    let (psk, token) = (&args[1], &args[2]);
    let count: usize = parse("CLIENTS", &args[3])?;
    let services: usize = parse("SERVICES", &args[4])?;
    let target: SocketAddr = parse("TARGET", &args[5])?;
    let hold: u64 = parse("HOLD_SECS", &args[6])?;
    let stop = CancellationToken::new();
    let started = Instant::now();
    let mut statuses = Vec::with_capacity(count);
    let mut tasks = tokio::task::JoinSet::new();
    for batch in (0..count).collect::<Vec<_>>().chunks(CLIENT_BATCH) {
        let mut waiting = Vec::new();
        for &i in batch {
            let mut builder = Client::builder(HostPort::from(server))
                .psk(psk)
                .default_token(token)
                .reconnect_delays(Duration::from_millis(200), Duration::from_secs(2));
            for j in 0..services {
                builder = builder.tcp_service(format!("c{i}s{j}"), HostPort::from(target));
            }
            let client = builder.build().map_err(|e| format!("client {i}: {e}"))?;
            let status = client.status();
            tasks.spawn(client.run(stop.child_token()));
            waiting.push(status.clone());
            statuses.push(status);
        }
        for mut status in waiting {
            let left = SETUP_TIMEOUT.saturating_sub(started.elapsed());
            match tokio::time::timeout(left, status.wait_for(|s| s.connected)).await {
                Ok(Ok(_)) => {}
                Ok(Err(_)) => return Err("a client stopped before connecting".into()),
                Err(_) => {
                    let up = statuses.iter().filter(|s| s.borrow().connected).count();
                    return Err(format!(
                        "only {up} of {count} sessions up after {SETUP_TIMEOUT:?}"
                    ));
                }
            }
        }
    }
    println!("ready {:.3}", started.elapsed().as_secs_f64());
    tokio::time::sleep(Duration::from_secs(hold)).await;
    let up = statuses.iter().filter(|s| s.borrow().connected).count();
    println!("still-up {up}");
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

async fn streams(args: &[String]) -> Result<(), String> {
    let sink: SocketAddr = parse("SINK", &args[0])?;
    let seconds: u64 = parse("SECONDS", &args[1])?;
    let count: usize = parse("COUNT", &args[2])?;
    let visitors: Vec<SocketAddr> = args[3..]
        .iter()
        .map(|a| parse("VISITOR_ADDR", a))
        .collect::<Result<_, _>>()?;
    let received: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let reached: Arc<Vec<AtomicBool>> =
        Arc::new((0..count).map(|_| AtomicBool::new(false)).collect());
    let accepted = Arc::new(AtomicU64::new(0));
    let listener = TcpListener::bind(sink)
        .await
        .map_err(|e| format!("cannot listen on {sink}: {e}"))?;
    let stop = CancellationToken::new();
    tokio::spawn(sink_loop(
        listener,
        Arc::clone(&received),
        Arc::clone(&reached),
        Arc::clone(&accepted),
        stop.clone(),
    ));

    let writing = Arc::new(AtomicBool::new(true));
    let (go, ready) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for batch in (0..count).collect::<Vec<_>>().chunks(STREAM_BATCH) {
        let mut connects = tokio::task::JoinSet::new();
        for &id in batch {
            let addr = visitors[id % visitors.len()];
            connects.spawn(async move {
                let stream =
                    tokio::time::timeout(Duration::from_secs(30), TcpStream::connect(addr)).await;
                (id, stream)
            });
        }
        while let Some(done) = connects.join_next().await {
            let (id, stream) = done.map_err(|e| e.to_string())?;
            let stream = match stream {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => return Err(format!("visitor {id}: {error}")),
                Err(_) => return Err(format!("visitor {id}: no connect within 30s")),
            };
            writers.spawn(write_loop(stream, id, ready.clone(), Arc::clone(&writing)));
        }
        // Let the tunnel open this batch's streams before the next one arrives.
        let opened_so_far = batch[batch.len() - 1] + 1;
        wait_until(BATCH_TIMEOUT, || {
            accepted.load(Ordering::Relaxed) as usize >= opened_so_far
        })
        .await;
    }
    let all_flowing = wait_until(BATCH_TIMEOUT, || {
        reached.iter().all(|r| r.load(Ordering::Relaxed))
    })
    .await;
    let flowing = reached.iter().filter(|r| r.load(Ordering::Relaxed)).count();
    println!(
        "open {flowing} accepted {} after {:.1}s",
        accepted.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    if !all_flowing {
        eprintln!("only {flowing} of {count} streams reached the sink; measuring anyway");
    }
    // Every stream starts writing at once; give them a moment to ramp up.
    let _ = go.send(true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before: Vec<u64> = received.iter().map(|r| r.load(Ordering::Relaxed)).collect();
    let window = Instant::now();
    println!("measuring");
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let elapsed = window.elapsed().as_secs_f64();
    let mut rates: Vec<f64> = received
        .iter()
        .zip(&before)
        .map(|(r, b)| (r.load(Ordering::Relaxed) - b) as f64 / elapsed)
        .collect();
    writing.store(false, Ordering::Relaxed);
    stop.cancel();
    rates.sort_by(f64::total_cmp);
    let at = |q: f64| rates[((rates.len() - 1) as f64 * q) as usize];
    let total: f64 = rates.iter().sum();
    let starved = rates.iter().filter(|r| **r == 0.0).count();
    println!(
        "{{\"streams\": {count}, \"seconds\": {elapsed:.2}, \"total_bytes_per_s\": {total:.0}, \"min\": {:.0}, \"p10\": {:.0}, \"median\": {:.0}, \"p90\": {:.0}, \"max\": {:.0}, \"starved\": {starved}}}",
        at(0.0),
        at(0.1),
        at(0.5),
        at(0.9),
        at(1.0)
    );
    writers.abort_all();
    Ok(())
}

/// Polls `done` every 50 ms for at most `limit`; whether it came true.
async fn wait_until(limit: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done()
}

/// A visitor: its id first (so the sink knows whose bytes these are), then, once every
/// stream is open, bytes until told to stop or the tunnel closes.
async fn write_loop(
    mut stream: TcpStream,
    id: usize,
    mut ready: tokio::sync::watch::Receiver<bool>,
    writing: Arc<AtomicBool>,
) {
    if stream.write_all(&(id as u64).to_be_bytes()).await.is_err() {
        return;
    }
    if ready.wait_for(|go| *go).await.is_err() {
        return;
    }
    let chunk = vec![0x5a_u8; CHUNK];
    while writing.load(Ordering::Relaxed) {
        if stream.write_all(&chunk).await.is_err() {
            return;
        }
    }
}

/// The client's target: reads each stream's id, then counts its bytes.
async fn sink_loop(
    listener: TcpListener,
    received: Arc<Vec<AtomicU64>>,
    reached: Arc<Vec<AtomicBool>>,
    accepted: Arc<AtomicU64>,
    stop: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((mut stream, _)) = stream else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        accepted.fetch_add(1, Ordering::Relaxed);
        let received = Arc::clone(&received);
        let reached = Arc::clone(&reached);
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut id = [0u8; 8];
            if stream.read_exact(&mut id).await.is_err() {
                return;
            }
            let Some(id) = usize::try_from(u64::from_be_bytes(id))
                .ok()
                .filter(|id| *id < received.len())
            else {
                return;
            };
            reached[id].store(true, Ordering::Relaxed);
            let counter = &received[id];
            let mut buf = vec![0u8; CHUNK];
            loop {
                let read = tokio::select! {
                    () = stop.cancelled() => return,
                    read = stream.read(&mut buf) => read,
                };
                match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        counter.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
        });
    }
}
