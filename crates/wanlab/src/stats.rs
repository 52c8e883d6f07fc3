//! Counters shared between a forwarding thread and the reporter, CPU time from /proc, and the
//! report format (printed, and written as JSON for tests and bench). The JSON is the lab's
//! testimony: a test reads it to tell a wrong lab from a starved one.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

use crate::line::Counters;

/// Live counters of one direction, published by its thread after each batch.
#[derive(Default)]
pub struct DirStats {
    /// Kernel thread id of the forwarding thread (0 until it starts).
    pub tid: AtomicI32,
    in_pkts: AtomicU64,
    in_bytes: AtomicU64,
    fwd_pkts: AtomicU64,
    fwd_bytes: AtomicU64,
    random_drops: AtomicU64,
    queue_drops: AtomicU64,
    delay_drops: AtomicU64,
    /// Writes into the far TUN that failed.
    pub write_errors: AtomicU64,
    /// Sum of delivery lateness (write time − deadline), ns.
    pub late_sum_ns: AtomicU64,
    /// Worst delivery lateness, ns.
    pub late_max_ns: AtomicU64,
    /// Deliveries more than 1 ms late: the sign of a starved (not a wrong) line.
    pub late_over_1ms: AtomicU64,
    /// Peak drop-tail queue occupancy, bytes.
    pub queue_peak_bytes: AtomicU64,
    /// Worst overshoot of a timed sleep, ns.
    pub wake_late_max_ns: AtomicU64,
    /// Timed sleeps that overshot by over 1 ms: the thread was starved even if no delivery
    /// was late (an idle line's input waits just as long).
    pub wake_over_1ms: AtomicU64,
    /// The thread's CPU time in µs, stored as it exits (its /proc entry goes with it).
    pub final_cpu_us: AtomicU64,
}

impl DirStats {
    /// Publishes the line's totals.
    pub fn publish(&self, c: &Counters) {
        self.in_pkts.store(c.in_pkts, Relaxed);
        self.in_bytes.store(c.in_bytes, Relaxed);
        self.fwd_pkts.store(c.fwd_pkts, Relaxed);
        self.fwd_bytes.store(c.fwd_bytes, Relaxed);
        self.random_drops.store(c.random_drops, Relaxed);
        self.queue_drops.store(c.queue_drops, Relaxed);
        self.delay_drops.store(c.delay_drops, Relaxed);
    }

    /// Called by the thread itself as it exits.
    pub fn record_exit_cpu(&self, ticks: u64) {
        let s = cpu_seconds("/proc/thread-self/stat", ticks).unwrap_or(0.0);
        // At least 1 µs so the value reads as "stored".
        self.final_cpu_us.store(((s * 1e6) as u64).max(1), Relaxed);
    }

    /// Records how late a timed sleep returned.
    pub fn record_wake(&self, late_ns: u64) {
        self.wake_late_max_ns.fetch_max(late_ns, Relaxed);
        if late_ns > 1_000_000 {
            self.wake_over_1ms.fetch_add(1, Relaxed);
        }
    }

    /// Records one delivery `late_ns` after its deadline.
    pub fn record_late(&self, late_ns: u64) {
        self.late_sum_ns.fetch_add(late_ns, Relaxed);
        self.late_max_ns.fetch_max(late_ns, Relaxed);
        if late_ns > 1_000_000 {
            self.late_over_1ms.fetch_add(1, Relaxed);
        }
    }

    /// A consistent-enough copy for reporting.
    pub fn snapshot(&self, ticks: u64) -> DirReport {
        let fwd = self.fwd_pkts.load(Relaxed);
        let tid = self.tid.load(Relaxed);
        DirReport {
            in_pkts: self.in_pkts.load(Relaxed),
            in_bytes: self.in_bytes.load(Relaxed),
            fwd_pkts: fwd,
            fwd_bytes: self.fwd_bytes.load(Relaxed),
            random_drops: self.random_drops.load(Relaxed),
            queue_drops: self.queue_drops.load(Relaxed),
            delay_drops: self.delay_drops.load(Relaxed),
            write_errors: self.write_errors.load(Relaxed),
            late_avg_us: if fwd > 0 {
                self.late_sum_ns.load(Relaxed) as f64 / fwd as f64 / 1e3
            } else {
                0.0
            },
            late_max_us: self.late_max_ns.load(Relaxed) as f64 / 1e3,
            late_over_1ms: self.late_over_1ms.load(Relaxed),
            queue_peak_bytes: self.queue_peak_bytes.load(Relaxed),
            wake_late_max_us: self.wake_late_max_ns.load(Relaxed) as f64 / 1e3,
            wake_over_1ms: self.wake_over_1ms.load(Relaxed),
            cpu_s: match self.final_cpu_us.load(Relaxed) {
                0 if tid > 0 => {
                    cpu_seconds(&format!("/proc/self/task/{tid}/stat"), ticks).unwrap_or(0.0)
                }
                us => us as f64 / 1e6,
            },
        }
    }
}

/// One direction in a report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DirReport {
    /// Packets read from the near TUN.
    pub in_pkts: u64,
    /// Bytes read (IP packet bytes: what the rate counts).
    pub in_bytes: u64,
    /// Packets written to the far TUN.
    pub fwd_pkts: u64,
    /// Bytes written.
    pub fwd_bytes: u64,
    /// Random loss drops.
    pub random_drops: u64,
    /// Drop-tail queue drops.
    pub queue_drops: u64,
    /// Delay-stage bound drops (0 on a correct line).
    pub delay_drops: u64,
    /// Failed writes to the far TUN.
    pub write_errors: u64,
    /// Mean delivery lateness past the deadline, µs.
    pub late_avg_us: f64,
    /// Worst delivery lateness, µs.
    pub late_max_us: f64,
    /// Deliveries over 1 ms late.
    pub late_over_1ms: u64,
    /// Peak queue occupancy, bytes.
    pub queue_peak_bytes: u64,
    /// Worst overshoot of a timed sleep, µs.
    #[serde(default)]
    pub wake_late_max_us: f64,
    /// Timed sleeps that overshot by over 1 ms.
    #[serde(default)]
    pub wake_over_1ms: u64,
    /// CPU time (utime + stime) of the thread serving this direction, s; with one thread for
    /// both directions (the default) both show that thread's total.
    pub cpu_s: f64,
}

/// The whole report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// Seconds since the line started.
    pub elapsed_s: f64,
    /// Process CPU time (utime + stime from /proc/self/stat), s.
    pub cpu_s: f64,
    /// Process CPU over the whole run, % of one core.
    pub cpu_pct: f64,
    /// Process CPU over the last reporting interval, % of one core.
    pub interval_cpu_pct: f64,
    /// A forwarding thread used over 90 % of a core in the last interval: figures measured
    /// through the lab then say more about the host than about the link.
    pub cpu_bound: bool,
    /// Whether this is the final report (written on SIGTERM/SIGINT).
    pub final_report: bool,
    /// Side A to side B.
    pub a_to_b: DirReport,
    /// Side B to side A.
    pub b_to_a: DirReport,
    /// The line's settings, for the record.
    pub config: ConfigReport,
}

/// The settings a report was produced under.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConfigReport {
    /// Namespace of side A.
    pub ns_a: String,
    /// Namespace of side B.
    pub ns_b: String,
    /// Bits per second.
    pub rate_bps: u64,
    /// One-way delay, ms.
    pub delay_ms: f64,
    /// Jitter, ms.
    pub jitter_ms: f64,
    /// Loss, percent.
    pub loss_pct: f64,
    /// Queue limit, bytes.
    pub queue_bytes: usize,
}

/// utime + stime, in seconds, from a /proc `stat` file.
pub fn cpu_seconds(path: &str, ticks: u64) -> Option<f64> {
    let s = std::fs::read_to_string(path).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name, field 3 (state) is index 0, so utime (14) and stime (15) are 11 and 12.
    let ut: u64 = f.get(11)?.parse().ok()?;
    let st: u64 = f.get(12)?.parse().ok()?;
    Some((ut + st) as f64 / ticks as f64)
}

impl Report {
    /// A human-readable block, one line per direction.
    pub fn human(&self) -> String {
        let dir = |name: &str, d: &DirReport| {
            format!(
                "  {name}: fwd {} pkts {} bytes, random drops {}, queue drops {}, delay drops {}, write errors {}, late avg {:.0} µs max {:.0} µs (>1ms: {}), wake late max {:.0} µs (>1ms: {}), queue peak {} B, thread cpu {:.2} s",
                d.fwd_pkts,
                d.fwd_bytes,
                d.random_drops,
                d.queue_drops,
                d.delay_drops,
                d.write_errors,
                d.late_avg_us,
                d.late_max_us,
                d.late_over_1ms,
                d.wake_late_max_us,
                d.wake_over_1ms,
                d.queue_peak_bytes,
                d.cpu_s
            )
        };
        format!(
            "wanlab {}{:.1}s: cpu {:.2}s ({:.1}% of a core, last interval {:.1}%){}\n{}\n{}",
            if self.final_report { "final, " } else { "" },
            self.elapsed_s,
            self.cpu_s,
            self.cpu_pct,
            self.interval_cpu_pct,
            if self.cpu_bound {
                " CPU-BOUND: figures reflect the host, not the link"
            } else {
                ""
            },
            dir("A->B", &self.a_to_b),
            dir("B->A", &self.b_to_a)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_cpu_time() {
        let t = cpu_seconds("/proc/self/stat", crate::sys::clock_ticks());
        assert!(t.is_some_and(|t| t >= 0.0));
    }

    #[test]
    fn lateness_accounting() {
        let d = DirStats::default();
        d.publish(&Counters {
            fwd_pkts: 2,
            ..Default::default()
        });
        d.record_late(1000);
        d.record_late(3_000_000);
        let r = d.snapshot(100);
        assert_eq!(r.late_over_1ms, 1);
        assert_eq!(r.late_max_us, 3000.0);
        assert!((r.late_avg_us - 1500.5).abs() < 1e-9);
    }
}
