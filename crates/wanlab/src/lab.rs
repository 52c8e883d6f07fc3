//! [`Lab`]: a whole lab for tests and bench in one call. It creates two uniquely named
//! namespaces, picks the TCP congestion control in them, starts `wanlab run` between them and
//! waits until the line is up; dropping it stops that process (by its PID) and deletes the
//! namespaces, so a failing test leaves nothing behind.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::netns;
use crate::profiles::Profile;
use crate::stats::Report;

/// Side A's address (RFC 5737 documentation range).
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// Side B's address.
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);

/// How to start a lab.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// The `wanlab` binary.
    pub bin: PathBuf,
    /// Line shape.
    pub profile: Profile,
    /// Extra arguments for `wanlab run` (e.g. `--jitter 2ms`).
    pub extra_args: Vec<String>,
    /// TCP congestion control inside both namespaces.
    pub congestion_control: String,
    /// SCHED_FIFO priority of the line's threads (0: normal). On by default: on a shared,
    /// busy host CFS delays wake-ups by milliseconds, which is the lab measuring the host.
    pub rt_priority: i32,
}

impl LabOptions {
    /// Options for `profile`, with the binary from `$WANLAB_BIN` or next to the current
    /// executable (where cargo puts it for tests and benches), and the real-time priority
    /// from `$WANLAB_RT_PRIORITY` (default 10; 0 to compare with normal scheduling).
    pub fn new(profile: Profile) -> LabOptions {
        let bin = std::env::var_os("WANLAB_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let exe = std::env::current_exe().unwrap_or_default();
                let dir = exe.parent().map(|d| d.to_path_buf()).unwrap_or_default();
                // target/debug/deps/test-binary -> target/debug/wanlab
                let up = dir.parent().map(|d| d.join("wanlab")).unwrap_or_default();
                if dir.join("wanlab").exists() {
                    dir.join("wanlab")
                } else {
                    up
                }
            });
        let rt_priority = std::env::var("WANLAB_RT_PRIORITY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10);
        LabOptions {
            bin,
            profile,
            extra_args: Vec::new(),
            congestion_control: "cubic".into(),
            rt_priority,
        }
    }
}

/// A running lab. Run commands on either side with [`Lab::cmd_a`] / [`Lab::cmd_b`].
pub struct Lab {
    /// Namespace of side A.
    pub ns_a: String,
    /// Namespace of side B.
    pub ns_b: String,
    /// The shape it was started with.
    pub profile: Profile,
    child: Option<Child>,
    stats_path: PathBuf,
    created: Vec<String>,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl Lab {
    /// Starts a lab with `profile` and default options.
    pub fn start(profile: Profile) -> Result<Lab> {
        Lab::start_with(LabOptions::new(profile))
    }

    /// Starts a lab.
    pub fn start_with(o: LabOptions) -> Result<Lab> {
        if !o.bin.exists() {
            bail!(
                "wanlab binary {} not found: build it (`cargo build -p wanlab`) or set WANLAB_BIN",
                o.bin.display()
            );
        }
        let id = format!(
            "{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let mut lab = Lab {
            ns_a: format!("wanlab-{id}-a"),
            ns_b: format!("wanlab-{id}-b"),
            profile: o.profile,
            child: None,
            stats_path: std::env::temp_dir().join(format!("wanlab-{id}.json")),
            created: Vec::new(),
        };
        // From here on Drop cleans up whatever was made, even on an early return.
        for ns in [lab.ns_a.clone(), lab.ns_b.clone()] {
            netns::create(&ns)?;
            lab.created.push(ns);
        }
        netns::set_congestion_control(&[&lab.ns_a, &lab.ns_b], &o.congestion_control)?;
        let p = o.profile;
        let mut cmd = Command::new(&o.bin);
        cmd.args(["run", "--ns-a", &lab.ns_a, "--ns-b", &lab.ns_b])
            .arg("--rate")
            .arg(format!("{}bit", p.rate_bps))
            .arg("--delay")
            .arg(format!("{}us", p.delay.as_micros()))
            .arg("--loss")
            .arg(format!("{}%", p.loss * 100.0))
            .args(["--stats-every", "250ms", "--stats-json"])
            .arg(&lab.stats_path)
            .arg("--rt-priority")
            .arg(o.rt_priority.to_string())
            .args(&o.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let _ = std::fs::remove_file(&lab.stats_path);
        lab.child = Some(
            cmd.spawn()
                .with_context(|| format!("starting {}", o.bin.display()))?,
        );
        let t = Instant::now();
        while !lab.stats_path.exists() {
            if let Some(st) = lab.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let mut err = String::new();
                if let Some(mut e) = lab.child.as_mut().and_then(|c| c.stderr.take()) {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                bail!("wanlab exited during setup ({st}): {}", err.trim());
            }
            if t.elapsed() > Duration::from_secs(20) {
                bail!("wanlab did not come up within 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // stderr carries periodic reports; drain it so the child never blocks on a full pipe.
        if let Some(mut e) = lab.child.as_mut().and_then(|c| c.stderr.take()) {
            std::thread::spawn(move || std::io::copy(&mut e, &mut std::io::sink()));
        }
        Ok(lab)
    }

    /// A command run inside side A's namespace.
    pub fn cmd_a(&self, prog: &str) -> Command {
        ns_cmd(&self.ns_a, prog)
    }

    /// A command run inside side B's namespace.
    pub fn cmd_b(&self, prog: &str) -> Command {
        ns_cmd(&self.ns_b, prog)
    }

    /// The latest report the line wrote (every 250 ms).
    pub fn stats(&self) -> Result<Report> {
        let s = std::fs::read(&self.stats_path)
            .with_context(|| format!("reading {}", self.stats_path.display()))?;
        Ok(serde_json::from_slice(&s)?)
    }

    /// Stops the line (SIGTERM, then SIGKILL after 5 s) and returns its final report.
    pub fn stop(&mut self) -> Result<Report> {
        if let Some(mut c) = self.child.take() {
            // SIGTERM by PID to the one process we started; see Drop for why not Child::kill.
            let _ = crate::sys::terminate(c.id());
            let t = Instant::now();
            while c.try_wait()?.is_none() {
                if t.elapsed() > Duration::from_secs(5) {
                    let _ = c.kill();
                    let _ = c.wait();
                    bail!("wanlab did not exit on SIGTERM within 5 s; killed");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.stats()
    }
}

fn ns_cmd(ns: &str, prog: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, prog]);
    c
}

impl Drop for Lab {
    fn drop(&mut self) {
        // A graceful stop lets the line close its TUN devices and write the final report;
        // std's Child::kill would be SIGKILL.
        let _ = self.stop();
        for ns in self.created.drain(..) {
            netns::delete(&ns);
        }
        let _ = std::fs::remove_file(&self.stats_path);
    }
}
