//! `wanlab`: the command line of Warren's WAN lab (see the crate's README).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use wanlab::engine::{RunOptions, run};
use wanlab::line::LineConfig;
use wanlab::units::{parse_duration, parse_percent, parse_rate};
use wanlab::{ADDR_A, ADDR_B, PROFILES, Profile};

#[derive(Parser)]
#[command(
    name = "wanlab",
    about = "Userspace WAN emulator: a delay line between two network namespaces"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Join two existing namespaces through a delay line until SIGINT/SIGTERM.
    Run(Box<RunArgs>),
    /// List the named profiles.
    Profiles,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Namespace of side A (create it with `ip netns add NAME`).
    #[arg(long)]
    ns_a: String,
    /// Namespace of side B.
    #[arg(long)]
    ns_b: String,
    /// A named profile (W1..W4); --rate/--delay/--loss override its parts.
    #[arg(long, value_parser = |s: &str| Profile::by_name(s))]
    profile: Option<Profile>,
    /// Bottleneck rate, e.g. 100mbit (bits/s, IP bytes).
    #[arg(long, value_parser = parse_rate)]
    rate: Option<u64>,
    /// One-way delay, e.g. 20ms.
    #[arg(long, value_parser = parse_duration)]
    delay: Option<Duration>,
    /// Random loss per packet, e.g. 1%.
    #[arg(long, value_parser = parse_percent)]
    loss: Option<f64>,
    /// Queue limit in bandwidth-delay products (rate × RTT).
    #[arg(long, default_value_t = 1.0, value_parser = parse_bdp)]
    queue_bdp: f64,
    /// Delay varies by ± up to this, e.g. 2ms (order kept unless --reorder).
    #[arg(long, value_parser = parse_duration, default_value = "0")]
    jitter: Duration,
    /// Let jitter reorder packets.
    #[arg(long)]
    reorder: bool,
    /// Print a report this often, e.g. 1s.
    #[arg(long, value_parser = parse_duration)]
    stats_every: Option<Duration>,
    /// Write the report as JSON here (periodically and at exit).
    #[arg(long)]
    stats_json: Option<PathBuf>,
    /// Address of side A (documentation ranges only).
    #[arg(long, default_value_t = ADDR_A)]
    addr_a: Ipv4Addr,
    /// Address of side B (documentation ranges only).
    #[arg(long, default_value_t = ADDR_B)]
    addr_b: Ipv4Addr,
    /// Busy-wait this long before each deadline instead of sleeping (costs CPU), e.g. 50us.
    #[arg(long, value_parser = parse_duration, default_value = "0")]
    spin: Duration,
    /// Seed for loss and jitter, for reproducible runs.
    #[arg(long)]
    seed: Option<u64>,
    /// Run the two forwarding threads SCHED_FIFO at this priority (1..99; 0 = normal), so a
    /// busy host does not delay deliveries. They sleep between packets.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..=99))]
    rt_priority: i32,
    /// Forwarding threads: 1 serves both directions (fewer wake-ups, less CPU); 2 gives each
    /// direction its own thread and its own CPU figure.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    threads: u8,
}

fn parse_bdp(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err(format!(
            "--queue-bdp `{s}` must be a number above 0 and at most 100, e.g. 1.0"
        )),
    }
}

fn main() -> ExitCode {
    match Cli::parse().cmd {
        Cmd::Profiles => {
            for p in PROFILES {
                println!(
                    "{}: {} ms one way, {} Mbit/s, {}% loss",
                    p.name,
                    p.delay.as_millis(),
                    p.rate_bps / 1_000_000,
                    p.loss * 100.0
                );
            }
            ExitCode::SUCCESS
        }
        Cmd::Run(a) => {
            let Some(rate) = a.rate.or(a.profile.map(|p| p.rate_bps)) else {
                eprintln!("wanlab: no rate: give --rate (e.g. 100mbit) or --profile (W1..W4)");
                return ExitCode::from(2);
            };
            let Some(delay) = a.delay.or(a.profile.map(|p| p.delay)) else {
                eprintln!("wanlab: no delay: give --delay (e.g. 20ms) or --profile (W1..W4)");
                return ExitCode::from(2);
            };
            let loss = a.loss.or(a.profile.map(|p| p.loss)).unwrap_or(0.0);
            let mut line = LineConfig::new(rate, delay.as_nanos() as u64, loss, a.queue_bdp);
            line.jitter_ns = a.jitter.as_nanos() as u64;
            line.reorder = a.reorder;
            let o = RunOptions {
                ns_a: a.ns_a,
                ns_b: a.ns_b,
                addr_a: a.addr_a,
                addr_b: a.addr_b,
                line,
                stats_every: a.stats_every.filter(|d| !d.is_zero()),
                stats_json: a.stats_json,
                spin: a.spin,
                seed: a.seed,
                rt_priority: a.rt_priority,
                threads: a.threads,
            };
            match run(o) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("wanlab: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
