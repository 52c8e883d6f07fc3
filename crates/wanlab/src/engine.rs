//! The running lab: opens the two TUN devices, moves them into their namespaces, runs the
//! forwarding thread(s) and reports until SIGINT/SIGTERM.
//!
//! Each thread owns its [`Line`]s, so there are no locks on the packet path. A thread sleeps
//! in `ppoll` on its input TUNs with a nanosecond timeout set to the lines' next event, so it
//! wakes either for a packet or for a deadline; an optional short spin covers the kernel's
//! wake-up latency when that matters more than CPU.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::line::{Line, LineConfig};
use crate::netns;
use crate::stats::{ConfigReport, DirStats, Report, cpu_seconds};
use crate::sys;

/// Longest a forwarding thread sleeps without an event, so it notices the stop flag.
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// Buffers kept for reuse per direction; beyond that they are freed.
const POOL_MAX: usize = 1024;
/// Packets read per wake-up before delivering, so a flood cannot delay due deliveries.
const READ_BATCH: usize = 64;
/// With at least this much backlog in the queue, stop waking for each arriving packet.
const LAZY_READ_MIN: u64 = 200_000;
/// Read input at most this late when lazy. It bounds how much emptier the queue may look to
/// a packet read late (rate × this: 6 KB of a 500 KB queue at 100 Mbit/s), and keeps well
/// inside the TUN's own 500-packet queue.
const LAZY_READ_MAX: u64 = 500_000;
/// Margin kept between a lazy read and the moment the queue would run dry.
const LAZY_READ_MARGIN: u64 = 100_000;

/// Everything `wanlab run` needs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Namespace of side A (must exist).
    pub ns_a: String,
    /// Namespace of side B (must exist).
    pub ns_b: String,
    /// Address of side A's interface.
    pub addr_a: Ipv4Addr,
    /// Address of side B's interface.
    pub addr_b: Ipv4Addr,
    /// Line shape, used for both directions.
    pub line: LineConfig,
    /// Print (and write) a report this often; `None`: only at the end.
    pub stats_every: Option<Duration>,
    /// Where to write the JSON report (atomically replaced each time).
    pub stats_json: Option<PathBuf>,
    /// Busy-wait this long before a deadline instead of sleeping.
    pub spin: Duration,
    /// Seed for the loss and jitter generator; `None`: from the OS.
    pub seed: Option<u64>,
    /// Run the forwarding threads in SCHED_FIFO at this priority (0: normal scheduling).
    pub rt_priority: i32,
    /// 1: one thread serves both directions (fewer wake-ups); 2: one thread each.
    pub threads: u8,
}

/// Runs the lab until SIGINT or SIGTERM, then writes the final report and returns.
pub fn run(o: RunOptions) -> Result<()> {
    // Input first, then the host: a bad address is the caller's fix whatever exists.
    netns::check_doc_addr(o.addr_a)?;
    netns::check_doc_addr(o.addr_b)?;
    netns::check_exists(&o.ns_a)?;
    netns::check_exists(&o.ns_b)?;
    if o.ns_a == o.ns_b {
        bail!(
            "--ns-a and --ns-b are both `{}`: the two sides need two namespaces",
            o.ns_a
        );
    }
    if o.addr_a == o.addr_b {
        bail!(
            "--addr-a and --addr-b are both {}: give each side its own address",
            o.addr_a
        );
    }
    // Before any thread exists, so every thread inherits the mask and only the main thread
    // ever takes the signal (in sigtimedwait).
    sys::block_stop_signals().context("blocking SIGINT/SIGTERM")?;

    let pid = std::process::id();
    let (dev_a, dev_b) = (format!("wl{pid}a"), format!("wl{pid}b"));
    let open = |dev: &str| {
        sys::open_tun(dev).with_context(|| {
            format!("opening TUN device {dev} via /dev/net/tun (needs root or CAP_NET_ADMIN, and the tun module)")
        })
    };
    let tun_a = open(&dev_a)?;
    let tun_b = open(&dev_b)?;
    netns::attach(&dev_a, &o.ns_a, o.addr_a, o.addr_b)?;
    netns::attach(&dev_b, &o.ns_b, o.addr_b, o.addr_a)?;

    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let st_ab = Arc::new(DirStats::default());
    let st_ba = Arc::new(DirStats::default());
    let mut seeder = match o.seed {
        Some(s) => StdRng::seed_from_u64(s),
        None => StdRng::from_os_rng(),
    };
    let mut dir = |rx: &File, tx: &File, st: &Arc<DirStats>| -> Result<Dir> {
        Ok(Dir {
            rx: rx.try_clone()?,
            tx: tx.try_clone()?,
            line: Line::new(o.line.clone(), StdRng::from_rng(&mut seeder), 0),
            st: st.clone(),
        })
    };
    let ab = dir(&tun_a, &tun_b, &st_ab)?;
    let ba = dir(&tun_b, &tun_a, &st_ba)?;
    // One thread for both directions by default: a delivery written into one TUN runs the
    // far stack, whose reply (an ACK, or the next segments) is then already readable on the
    // other TUN, so one wake-up serves both instead of waking a second thread for it.
    let groups = if o.threads == 1 {
        vec![("wanlab-line", vec![ab, ba])]
    } else {
        vec![("wanlab-a2b", vec![ab]), ("wanlab-b2a", vec![ba])]
    };
    let mut handles = Vec::new();
    for (name, dirs) in groups {
        let (stop, spin, rt) = (stop.clone(), o.spin, o.rt_priority);
        handles.push(thread::Builder::new().name(name.into()).spawn(move || {
            if rt > 0 {
                sys::set_realtime(rt)
                    .context("SCHED_FIFO for the forwarding thread (needs root)")?;
            }
            let sts: Vec<_> = dirs.iter().map(|d| d.st.clone()).collect();
            let r = forward(dirs, &stop, t0, spin);
            for st in sts {
                st.record_exit_cpu(sys::clock_ticks());
            }
            r
        })?);
    }

    let ticks = sys::clock_ticks();
    let cfg = ConfigReport {
        ns_a: o.ns_a.clone(),
        ns_b: o.ns_b.clone(),
        rate_bps: o.line.rate_bps,
        delay_ms: o.line.delay_ns as f64 / 1e6,
        jitter_ms: o.line.jitter_ns as f64 / 1e6,
        loss_pct: o.line.loss * 100.0,
        queue_bytes: o.line.queue_bytes,
    };
    let mut reporter = Reporter {
        ticks,
        last_t: 0.0,
        last_cpu: 0.0,
        last_dir: (0.0, 0.0),
        cfg,
    };
    eprintln!(
        "wanlab: {dev_a} in {} ({}) <-> {dev_b} in {} ({}), {} bit/s, {} ms one way, {:.3}% loss, queue {} B",
        o.ns_a,
        o.addr_a,
        o.ns_b,
        o.addr_b,
        o.line.rate_bps,
        o.line.delay_ns as f64 / 1e6,
        o.line.loss * 100.0,
        o.line.queue_bytes
    );
    // The first report doubles as the "ready" mark for whoever waits on the JSON file.
    let write_json = |r: &Report| -> Result<()> {
        if let Some(p) = &o.stats_json {
            let tmp = p.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(r)?)
                .with_context(|| format!("writing {}", tmp.display()))?;
            std::fs::rename(&tmp, p).with_context(|| format!("renaming to {}", p.display()))?;
        }
        Ok(())
    };
    write_json(&reporter.report(t0, &st_ab, &st_ba, false))?;

    let tick = o.stats_every.unwrap_or(Duration::from_secs(1));
    loop {
        if sys::wait_stop_signal(tick).is_some() {
            break;
        }
        if handles.iter().any(|h| h.is_finished()) {
            // A thread died (its error is reported below); stop rather than run half a lab.
            break;
        }
        let r = reporter.report(t0, &st_ab, &st_ba, false);
        if o.stats_every.is_some() {
            eprintln!("{}", r.human());
        }
        write_json(&r)?;
    }
    stop.store(true, Relaxed);
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("forwarding thread panicked"))
        })
        .collect();
    let r = reporter.report(t0, &st_ab, &st_ba, true);
    println!("{}", r.human());
    write_json(&r)?;
    for r in results {
        r?.context("forwarding")?;
    }
    // tun_a/tun_b close here, which removes the devices: nothing else was created.
    drop((tun_a, tun_b));
    Ok(())
}

struct Reporter {
    ticks: u64,
    last_t: f64,
    last_cpu: f64,
    last_dir: (f64, f64),
    cfg: ConfigReport,
}

impl Reporter {
    fn report(&mut self, t0: Instant, ab: &DirStats, ba: &DirStats, final_report: bool) -> Report {
        let t = t0.elapsed().as_secs_f64();
        let cpu = cpu_seconds("/proc/self/stat", self.ticks).unwrap_or(0.0);
        let (a, b) = (ab.snapshot(self.ticks), ba.snapshot(self.ticks));
        let dt = (t - self.last_t).max(1e-9);
        let pct = |c: f64, last: f64| (c - last) / dt * 100.0;
        // /proc times have 10 ms resolution: below ~0.5 s an interval says little.
        let cpu_bound = dt >= 0.5
            && (pct(a.cpu_s, self.last_dir.0) > 90.0 || pct(b.cpu_s, self.last_dir.1) > 90.0);
        let r = Report {
            elapsed_s: t,
            cpu_s: cpu,
            cpu_pct: cpu / t.max(1e-9) * 100.0,
            interval_cpu_pct: pct(cpu, self.last_cpu),
            cpu_bound,
            final_report,
            a_to_b: a,
            b_to_a: b,
            config: self.cfg.clone(),
        };
        self.last_t = t;
        self.last_cpu = cpu;
        self.last_dir = (r.a_to_b.cpu_s, r.b_to_a.cpu_s);
        r
    }
}

/// One direction as a forwarding thread sees it.
struct Dir {
    rx: File,
    tx: File,
    line: Line<StdRng>,
    st: Arc<DirStats>,
}

/// Forwards `dirs` (one direction, or both in one thread) until `stop`.
fn forward(mut dirs: Vec<Dir>, stop: &AtomicBool, t0: Instant, spin: Duration) -> Result<()> {
    sys::set_timer_slack_min();
    for d in &dirs {
        d.st.tid.store(sys::gettid(), Relaxed);
    }
    let clock = || t0.elapsed().as_nanos() as u64;
    let spin_ns = spin.as_nanos() as u64;
    let idle_ns = IDLE_WAIT.as_nanos() as u64;
    let mut buf = vec![0u8; 65536];
    let mut pool: Vec<Vec<u8>> = Vec::new();
    while !stop.load(Relaxed) {
        for d in dirs.iter_mut() {
            for _ in 0..READ_BATCH {
                match (&d.rx).read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let mut v = pool.pop().unwrap_or_default();
                        v.clear();
                        v.extend_from_slice(&buf[..n]);
                        if let Some(dropped) = d.line.arrive(clock(), v) {
                            pool.push(dropped);
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e).context("reading from TUN"),
                }
            }
            d.st.queue_peak_bytes
                .fetch_max(d.line.queued_bytes() as u64, Relaxed);
        }
        for d in dirs.iter_mut() {
            while let Some((pkt, deadline)) = d.line.pop_due(clock()) {
                if (&d.tx).write(&pkt).is_err() {
                    // The far side's interface may be down or gone; count it, keep running.
                    d.st.write_errors.fetch_add(1, Relaxed);
                }
                d.st.record_late(clock().saturating_sub(deadline));
                if pool.len() < POOL_MAX {
                    pool.push(pkt);
                }
            }
            d.st.publish(&d.line.counters);
        }
        let now = clock();
        let mut wait = idle_ns;
        // Inputs worth a wake-up per packet: those of lines that are not backlogged. A
        // backlogged line's arrivals leave when the bucket says, whenever they are read, so
        // it is read lazily (at most LAZY_READ_MAX late) instead: context switches are most
        // of the lab's CPU.
        let mut watch: Vec<&File> = Vec::with_capacity(2);
        for d in &dirs {
            if let Some(t) = d.line.next_event() {
                wait = wait.min(t.saturating_sub(now));
            }
            let backlog = d.line.backlog_ns();
            if backlog >= LAZY_READ_MIN {
                wait = wait.min((backlog - LAZY_READ_MARGIN).min(LAZY_READ_MAX));
            } else {
                watch.push(&d.rx);
            }
        }
        if wait > spin_ns {
            let nap = wait - spin_ns;
            let readable =
                sys::wait_readable(&watch, Duration::from_nanos(nap)).context("ppoll on TUN")?;
            if !readable {
                // A timed-out wait says how late the scheduler runs us, including on an idle
                // line where no delivery is late: the input may have waited just as long.
                let late = clock().saturating_sub(now + nap);
                for d in &dirs {
                    d.st.record_wake(late);
                }
            }
        } else if wait > 0 {
            let end = now + wait;
            while clock() < end {
                std::hint::spin_loop();
            }
        }
    }
    Ok(())
}
