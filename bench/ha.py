#!/usr/bin/env python3
"""High-availability figures of Warren (issue 43), from runs of `tests/e2e_ha.rs`.

    bench/ha.py [--runs 20] [--hog] [--tests freeze,black-hole,frozen-server,...]
    bench/ha.py --logs /tmp/ha_run_*.log      # summarize runs made already

Runs the release e2e_ha test binary (two servers and two clients behind HAProxy, steady
visitors checking their bytes; see that file) `--runs` times, with `stress-ng --cpu 2`
beside it when `--hog` is given, and reports over all runs, per failure:

- the time from the fault (SIGSTOP, iptables DROP) to "no new stream goes there" (the
  peers' `session_suspect`) and to "session dropped" (`session_dead`): median and max;
- visitors that started during the fault, how many failed (target 0), the slowest (target
  at most 3 s), and visitors in flight at the fault that failed;
- rolling restarts: visitors failed (target 0) and SIGTERM-to-exit times.

The heartbeat's cost at 1,000 idle sessions is `bench/scale.py --only sessions --clients
1000 --per-client 10 --idle-seconds 30` (target: at most 2 % of a core).

Needs the test binary (`cargo test --release -p warren --test e2e_ha --no-run`), HAProxy,
nginx, iptables and root (the black-hole test). Python 3 standard library only; every
process started is stopped, and each run has a timeout.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

TESTS = {
    "kill": "two_servers_two_clients_behind_haproxy_survive_sigkill_of_each",
    "freeze": "a_frozen_client_strands_no_visitor_that_arrives_after_the_freeze",
    "black-hole": "a_black_holed_client_strands_no_visitor_that_arrives_after_the_cut",
    "frozen-server": "a_frozen_server_strands_no_visitor_behind_a_balancer_that_checks_readyz",
    "client-restart": "a_rolling_restart_of_both_clients_fails_no_visitor",
    "server-restart": "a_rolling_restart_of_both_servers_fails_no_visitor",
}

# What each run prints, by the line that starts its report.
FAULTS = {
    "HA run with a frozen client": "freeze (SIGSTOP a client)",
    "HA run with a black-holed client": "black hole (iptables DROP a client)",
    "HA run with a frozen server": "frozen server (HAProxy mode http)",
}

DURATION = re.compile(r"([0-9.]+)(ns|µs|us|ms|s)\b")
TALLY = re.compile(r"\((\d+), (\d+), (\d+), (\d+)\)")


def seconds(text: str) -> float:
    value, unit = DURATION.search(text).groups()
    scale = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]
    return float(value) * scale


def durations(text: str) -> list[float]:
    """Every `Some(1.23s)` in `text`, in seconds (a `None` is left out)."""
    return [seconds(m) for m in re.findall(r"Some\(([0-9.]+(?:ns|µs|us|ms|s))\)", text)]


def tally(line: str) -> tuple[int, int, int, int]:
    return tuple(int(x) for x in TALLY.search(line).groups())  # type: ignore[return-value]


def parse(text: str, into: dict) -> None:
    """Adds the figures of one run's output to `into`."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        for start, name in FAULTS.items():
            if line.startswith(start):
                fig = into.setdefault(name, {"suspect": [], "dead": [], "during": [],
                                             "slowest": [], "in_flight": [], "runs": 0})
                fig["runs"] += 1
                for follow in lines[i + 1:i + 10]:
                    if "suspect" in follow and "dead" in follow and "[" in follow:
                        head, _, tail = follow.partition("to dead")
                        fig["suspect"] += durations(head)
                        fig["dead"] += durations(tail)
                    elif "started during the fault" in follow or "started while it was frozen" in follow:
                        fig["during"].append(tally(follow))
                    elif "slowest of those" in follow:
                        fig["slowest"].append(seconds(follow))
                    elif "in flight at" in follow:
                        fig["in_flight"].append(tally(follow))
        if line.startswith("rolling restart of both"):
            name = "rolling restart of " + ("servers" if "servers" in line else "clients")
            fig = into.setdefault(name, {"whole": [], "exit": [], "runs": 0})
            fig["runs"] += 1
            fig["whole"].append(tally(line))
            if i + 1 < len(lines) and "SIGTERM to exit" in lines[i + 1]:
                fig["exit"] += [seconds(m.group(0)) for m in DURATION.finditer(
                    lines[i + 1].split(":", 1)[1]) if not m.group(0).endswith("ns")]
    passed = re.search(r"test result: \w+\. (\d+) passed; (\d+) failed", text)
    if passed:
        into.setdefault("_tests", []).append((int(passed.group(1)), int(passed.group(2))))


def ms(values: list[float]) -> str:
    if not values:
        return "—"
    return f"{statistics.median(values) * 1e3:,.0f} / {max(values) * 1e3:,.0f} ms"


def report(figures: dict) -> str:
    out = []
    tests = figures.get("_tests", [])
    if tests:
        failed = sum(f for _, f in tests)
        out.append(f"{len(tests)} runs of the test binary; test failures: {failed}\n")
    out.append("| failure | runs | → suspect (median / max) | → dead (median / max) | "
               "visitors during it | failed | slowest | in flight at it: failed |")
    out.append("|---|---|---|---|---|---|---|---|")
    for name in FAULTS.values():
        fig = figures.get(name)
        if not fig:
            continue
        during = fig["during"]
        started = sum(t[0] for t in during)
        failed = sum(t[0] - t[1] for t in during)
        in_flight = sum(t[0] for t in fig["in_flight"])
        cut = sum(t[0] - t[1] for t in fig["in_flight"])
        slowest = f"{max(fig['slowest']):.2f} s" if fig["slowest"] else "—"
        out.append(f"| {name} | {fig['runs']} | {ms(fig['suspect'])} | {ms(fig['dead'])} | "
                   f"{started:,} | {failed} | {slowest} | {cut} of {in_flight} |")
    for name in ("rolling restart of clients", "rolling restart of servers"):
        fig = figures.get(name)
        if not fig:
            continue
        started = sum(t[0] for t in fig["whole"])
        failed = sum(t[0] - t[1] for t in fig["whole"])
        exits = fig["exit"]
        span = f"{min(exits):.2f}–{max(exits):.2f} s" if exits else "—"
        out.append(f"\n{name}: {fig['runs']} runs, {started:,} visitors, {failed} failed; "
                   f"SIGTERM → exit {span}")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hog", action="store_true", help="stress-ng --cpu 2 beside the runs")
    parser.add_argument("--tests", default=",".join(TESTS),
                        help=f"comma-separated, of {', '.join(TESTS)}")
    parser.add_argument("--logs", nargs="*", help="summarize these saved outputs instead")
    args = parser.parse_args()
    figures: dict = {}
    if args.logs:
        for path in args.logs:
            parse(Path(path).read_text(errors="replace"), figures)
        print(report(figures))
        return 0
    binaries = sorted((REPO / "target/release/deps").glob("e2e_ha-*"),
                      key=lambda p: p.stat().st_mtime)
    binaries = [b for b in binaries if b.suffix != ".d"]
    if not binaries:
        print("no test binary: cargo test --release -p warren --test e2e_ha --no-run",
              file=sys.stderr)
        return 2
    names = [TESTS[t] for t in args.tests.split(",")]
    hog = subprocess.Popen(["stress-ng", "--cpu", "2", "--timeout", "7200s"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if args.hog else None
    try:
        for run in range(1, args.runs + 1):
            done = subprocess.run(
                [str(binaries[-1]), "--nocapture", "--test-threads", "6", "--exact", *names],
                cwd=REPO / "crates/warren", capture_output=True, text=True, timeout=1800,
                env={"WARREN_E2E_REQUIRE_TOOLS": "1", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
            parse(done.stdout + done.stderr, figures)
            print(f"run {run}: exit {done.returncode}", file=sys.stderr)
    finally:
        if hog:
            hog.terminate()
            hog.wait(timeout=10)
    print(report(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
