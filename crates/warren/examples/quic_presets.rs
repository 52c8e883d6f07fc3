//! Throughput of the two QUIC presets on loopback: raw quinn through Warren's endpoints,
//! TLS and PSK proof, one connection, one stream, no tunnel around it.
//!
//! ```sh
//! cargo run --release -p warren --example quic_presets            # 3 runs of each
//! cargo run --release -p warren --example quic_presets -- 5 10    # 5 runs, 10 s each
//! ```
//!
//! The server and the client run on two OS threads with one current-thread runtime each,
//! like two processes on this 2-core machine. The client writes for warm-up + window
//! seconds; the server counts what arrives during the window after a 1.5 s warm-up.
//! Gbit/s is receiver goodput; CPU is the whole process (both ends) over the window, as
//! CPU-seconds per GB received (USER_HZ = 100 assumed, as on every Linux x86 kernel).
//! Two ways to move bytes: `chunk` (1 MiB `Bytes` handed to quinn without copying, read
//! with `read_chunk`: QUINN-CEILING.md's main rows) and `copy` (64 KiB `write_all` / `read`
//! into a buffer, as a tunnel relaying TCP bytes does).
//!
//! Measured 2026-11-23 on the 2-vCPU dev machine, release build, 5 s windows. Run-to-run
//! noise is large (a compile elsewhere on the machine halves a run); two sessions:
//!
//! | preset | mode | Gbit/s, median of 5 [range] | CPU s/GB (both ends) | median of 3, other session |
//! |---|---|---|---|---|
//! | internet (1452) | chunk | 2.58 [2.22–3.34] | 3.77 | 5.51 [4.85–5.70], 2.75 s/GB |
//! | internet (1452) | copy  | 2.02 [1.29–2.06] | 3.89 | 2.39 [2.34–3.95], 3.36 s/GB |
//! | loopback (6500) | chunk | 8.83 [5.82–9.16] | 1.71 | 7.50 [5.58–8.84], 1.64 s/GB |
//! | loopback (6500) | copy  | 9.15 [4.18–9.53] | 1.60 | 6.51 [6.42–7.20], 2.21 s/GB |
//!
//! No packet was lost in any run; PMTUD reached 1452 and 6500 bytes. Peak RSS of the
//! process (both ends, 16/64 MiB windows): 67 MB. These agree with QUINN-CEILING.md
//! (1452 bytes: 3.9–4.5 Gbit/s zero-copy, 2.6 copying; 6500 with GSO: 6.7–8.4) within its
//! noise: the loopback preset is 3–4× the internet one at less than half the CPU per byte.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use warren::crypto::secret::Secret;
use warren::transport::quic::{self, ClientTls, QuicSettings, ServerTls, certs};

const PSK: &str = "quic-presets-example-psk-0123456789";
const WARMUP: Duration = Duration::from_millis(1500);
const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug)]
enum Mode {
    Chunk,
    Copy,
}

struct RunResult {
    gbps: f64,
    cpu_s_per_gb: f64,
    mtu: u16,
    lost: u64,
}

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn one_run(
    settings: &QuicSettings,
    mode: Mode,
    window: Duration,
    dir: &std::path::Path,
) -> RunResult {
    let cert = certs::load_or_create_self_signed(&dir.join("quic.pem")).expect("certificate");
    let server_tls = ServerTls::psk(cert.cert, cert.key, Secret::new(PSK)).expect("server tls");
    let (addr_tx, addr_rx) = std_mpsc::channel();
    let server_settings = settings.clone();
    let server = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let endpoint = quic::server_endpoint(
                SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
                &server_tls,
                &server_settings,
            )
            .expect("server endpoint");
            addr_tx.send(endpoint.socket).expect("send address");
            let incoming = endpoint.endpoint.accept().await.expect("incoming");
            let admitted = endpoint.admit(incoming).expect("admitted");
            let authenticated = quic::accept(admitted, &server_tls, DEADLINE)
                .await
                .expect("accepted");
            let (_, mut recv) = authenticated
                .connection
                .accept_bi()
                .await
                .expect("data stream");
            let mut first: Option<Instant> = None;
            let mut counted = 0u64;
            let mut cpu_start = 0.0;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match mode {
                    Mode::Chunk => match recv.read_chunk(usize::MAX, true).await {
                        Ok(Some(chunk)) => chunk.bytes.len(),
                        _ => break,
                    },
                    Mode::Copy => match recv.read(&mut buf).await {
                        Ok(Some(n)) => n,
                        _ => break,
                    },
                };
                let now = Instant::now();
                let start = *first.get_or_insert(now);
                let elapsed = now - start;
                if elapsed >= WARMUP && elapsed < WARMUP + window {
                    if counted == 0 {
                        cpu_start = cpu_seconds();
                    }
                    counted += n as u64;
                } else if elapsed >= WARMUP + window {
                    break;
                }
            }
            let cpu = cpu_seconds() - cpu_start;
            let stats = authenticated.connection.stats();
            authenticated.connection.close(0u32.into(), b"done");
            endpoint.endpoint.wait_idle().await;
            (counted, cpu, stats)
        })
    });
    let socket = addr_rx.recv().expect("server address");
    let client_settings = settings.clone();
    let client = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let endpoint =
                quic::client_endpoint(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), &client_settings)
                    .expect("client endpoint");
            let tls = ClientTls::psk(Secret::new(PSK), None).expect("client tls");
            let authenticated =
                quic::connect(&endpoint, socket.local_addr, "warren", &tls, DEADLINE)
                    .await
                    .expect("connected");
            let (mut send, _) = authenticated.connection.open_bi().await.expect("stream");
            let chunk = Bytes::from(vec![0x5a; 1024 * 1024]);
            let copy_buf = vec![0x5a; 64 * 1024];
            let until = Instant::now() + WARMUP + window + Duration::from_millis(500);
            while Instant::now() < until {
                let sent = match mode {
                    Mode::Chunk => send.write_chunk(chunk.clone()).await.is_ok(),
                    Mode::Copy => send.write_all(&copy_buf).await.is_ok(),
                };
                if !sent {
                    break;
                }
            }
            let _ = send.finish();
            let _ = authenticated.connection.closed().await;
        })
    });
    let (bytes, cpu, stats) = server.join().expect("server thread");
    let _ = client.join();
    let secs = window.as_secs_f64();
    RunResult {
        gbps: bytes as f64 * 8.0 / secs / 1e9,
        cpu_s_per_gb: cpu / (bytes as f64 / 1e9),
        mtu: stats.path.current_mtu,
        lost: stats.path.lost_packets,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let window = Duration::from_secs(args.next().and_then(|a| a.parse().ok()).unwrap_or(5));
    let dir = std::env::temp_dir().join(format!("warren-quic-presets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let presets = [
        ("internet", QuicSettings::internet()),
        ("loopback", QuicSettings::loopback()),
    ];
    println!("preset    mode   run  Gbit/s  CPU-s/GB  MTU    lost");
    let mut summary = Vec::new();
    for mode in [Mode::Chunk, Mode::Copy] {
        for (name, settings) in &presets {
            let mut gbps = Vec::new();
            let mut cpu = Vec::new();
            for run in 1..=runs {
                let r = one_run(settings, mode, window, &dir);
                println!(
                    "{name:<9} {:<6} {run:>3}  {:>6.2}  {:>8.2}  {:>5}  {}",
                    format!("{mode:?}").to_lowercase(),
                    r.gbps,
                    r.cpu_s_per_gb,
                    r.mtu,
                    r.lost
                );
                gbps.push(r.gbps);
                cpu.push(r.cpu_s_per_gb);
            }
            let (lo, hi) = gbps
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &g| (lo.min(g), hi.max(g)));
            summary.push(format!(
                "{name:<9} {:<6} median {:.2} Gbit/s [{lo:.2}-{hi:.2}], {:.2} CPU-s/GB",
                format!("{mode:?}").to_lowercase(),
                median(gbps),
                median(cpu)
            ));
        }
    }
    println!();
    for line in summary {
        println!("{line}");
    }
    println!(
        "peak RSS of the process (both ends): {:.1} MB",
        peak_rss_mb()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
