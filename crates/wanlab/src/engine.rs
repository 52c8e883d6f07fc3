//! The running lab: opens the two TUN devices, moves them into their namespaces, runs one
//! forwarding thread per direction and reports until SIGINT/SIGTERM.
//!
//! One thread per direction, each owning its [`Line`], means no locks on the packet path and
//! each direction's wake-ups are independent. A thread sleeps in `ppoll` on its input TUN with
//! a nanosecond timeout set to the line's next event, so it wakes either for a packet or for a
//! deadline; an optional short spin covers the kernel's wake-up latency when that matters more
//! than CPU.

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
    let mut spawn = |name: &str, rx: &File, tx: &File, st: &Arc<DirStats>| -> Result<_> {
        let (rx, tx) = (rx.try_clone()?, tx.try_clone()?);
        let line = Line::new(o.line.clone(), StdRng::from_rng(&mut seeder), 0);
        let (st, stop, spin, rt) = (st.clone(), stop.clone(), o.spin, o.rt_priority);
        Ok(thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                if rt > 0 {
                    sys::set_realtime(rt)
                        .context("SCHED_FIFO for the forwarding thread (needs root)")?;
                }
                let r = forward(rx, tx, line, &st, &stop, t0, spin);
                st.record_exit_cpu(sys::clock_ticks());
                r
            })?)
    };
    let h_ab = spawn("wanlab-a2b", &tun_a, &tun_b, &st_ab)?;
    let h_ba = spawn("wanlab-b2a", &tun_b, &tun_a, &st_ba)?;

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
        if h_ab.is_finished() || h_ba.is_finished() {
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
    let res_ab = h_ab
        .join()
        .map_err(|_| anyhow::anyhow!("A->B thread panicked"))?;
    let res_ba = h_ba
        .join()
        .map_err(|_| anyhow::anyhow!("B->A thread panicked"))?;
    let r = reporter.report(t0, &st_ab, &st_ba, true);
    println!("{}", r.human());
    write_json(&r)?;
    res_ab.context("A->B forwarding")?;
    res_ba.context("B->A forwarding")?;
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

fn forward(
    rx: File,
    tx: File,
    mut line: Line<StdRng>,
    st: &DirStats,
    stop: &AtomicBool,
    t0: Instant,
    spin: Duration,
) -> Result<()> {
    sys::set_timer_slack_min();
    st.tid.store(sys::gettid(), Relaxed);
    let clock = || t0.elapsed().as_nanos() as u64;
    let spin_ns = spin.as_nanos() as u64;
    let mut buf = vec![0u8; 65536];
    let mut pool: Vec<Vec<u8>> = Vec::new();
    while !stop.load(Relaxed) {
        for _ in 0..READ_BATCH {
            match (&rx).read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let mut v = pool.pop().unwrap_or_default();
                    v.clear();
                    v.extend_from_slice(&buf[..n]);
                    if let Some(dropped) = line.arrive(clock(), v) {
                        pool.push(dropped);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).context("reading from TUN"),
            }
        }
        st.queue_peak_bytes
            .fetch_max(line.queued_bytes() as u64, Relaxed);
        while let Some((pkt, deadline)) = line.pop_due(clock()) {
            if (&tx).write(&pkt).is_err() {
                // The far side's interface may be down or gone; count it, keep the line running.
                st.write_errors.fetch_add(1, Relaxed);
            }
            st.record_late(clock().saturating_sub(deadline));
            if pool.len() < POOL_MAX {
                pool.push(pkt);
            }
        }
        st.publish(&line.counters);
        let now = clock();
        let wait = line
            .next_event()
            .map_or(IDLE_WAIT.as_nanos() as u64, |t| t.saturating_sub(now));
        let wait = wait.min(IDLE_WAIT.as_nanos() as u64);
        let backlog = line.backlog_ns();
        if backlog >= LAZY_READ_MIN {
            // A saturated line: new arrivals leave when the bucket says, whenever they are read,
            // so sleep to the next deadline (or the lazy bound) without waking per packet.
            // Context switches are most of the lab's CPU.
            let lazy = (backlog - LAZY_READ_MARGIN).min(LAZY_READ_MAX);
            let nap = wait.min(lazy).saturating_sub(spin_ns);
            if nap > 0 {
                thread::sleep(Duration::from_nanos(nap));
                st.record_wake(clock().saturating_sub(now + nap));
            }
        } else if wait > spin_ns {
            let readable = sys::wait_readable(&rx, Duration::from_nanos(wait - spin_ns))
                .context("ppoll on TUN")?;
            if !readable {
                // A timed-out wait says how late the scheduler runs us, including on an idle
                // line where no delivery is late: the input may have waited just as long.
                st.record_wake(clock().saturating_sub(now + wait - spin_ns));
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
