#!/usr/bin/env python3
"""WAN benchmark (issue 44): Warren and its peers across the project's WAN lab.

The lab (crates/wanlab) joins two network namespaces through a userspace delay line with a
profile's rate, one-way delay and random loss. This script enters side A, where the tunnel
servers and every visitor run; the tunnel clients and the local services (iperf3 -s, the
echo service, sshd's readers) run in side B. Only the tunnel's own transport crosses the
emulated path (the `raw` row crosses it with no tunnel).

    bench/run.sh --wan                          # W1-W4, every config, files, fairness; writes
                                                # bench/results/wan-DATE.json, RESULTS.md's
                                                # WAN section and README.md's WAN table
    bench/run.sh --wan --smoke                  # ~30 s: W2, raw + Warren default, one file
    bench/run.sh --wan --profiles W2 --runs 1 --only warren-default,rathole-tcp
    python3 bench/wan.py render bench/results/wan-DATE.json [--write-results]

Per profile and config: iperf3 P1 and P4 (visitor -> target, the server-to-client
direction), an 8-visitor request/response echo of 16 KiB (req/s, p50, p99, every reply
checked byte for byte), and the lab's own counters for each step: packets the tunnel sent
into the bottleneck and how many the drop-tail queue dropped (self-inflicted drops, as
opposed to the profile's random loss), and the lab's CPU. Files: `warren send` of 200 MiB
and 500 x 256 KiB against scp, rsync over ssh and croc, every received file hashed.
Fairness: on W1 with the lab's queue at 0.5 and 2 BDP, one Warren default-config flow and
one plain cubic flow share the link for 20 s.

Python 3 standard library only; processes, tunnels and figures come from bench.py and
files.py. Root is needed (namespaces, TUN devices).
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as B  # noqa: E402
import files as F  # noqa: E402

HERE = B.HERE
REPO = B.REPO
ADDR_A = "198.51.100.1"  # the lab's defaults (crates/wanlab): side A, tunnel servers
ADDR_B = "198.51.100.2"  # side B: tunnel clients and local services
NS_PREFIX = "warren-wan-"
ALLOWED_CC = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
SECTION = "## Across the WAN lab (issue 44)"
README_START = "<!-- wan-bench:start -->"
README_END = "<!-- wan-bench:end -->"

CONFIGS = ["raw", "warren-default", "rathole-tcp", "warren-quic", "frp-tls", "warren-tcp",
           "frp-quic", "warren-tls", "warren-wss", "warren-quic-cubic", "warren-quic-bbr"]
LABELS = {
    "raw": "no tunnel (cubic, across the lab)",
    "warren-default": "Warren, default config",
    "warren-tcp": "Warren tcp",
    "warren-tls": "Warren tls",
    "warren-wss": "Warren wss",
    "warren-quic": "Warren quic (its default controller, `model`)",
    "warren-quic-cubic": "Warren quic, quinn's cubic",
    "warren-quic-bbr": "Warren quic, quinn's bbr",
    "rathole-tcp": "rathole tcp",
    "frp-tls": "frp tls",
    "frp-quic": "frp quic",
}
FILE_TOOLS = ["warren-direct", "scp", "scp-aes128gcm", "rsync", "croc"]
MIB = 1 << 20
DATASETS = {
    "200MiB": ("200 MiB, one file", [("big.bin", 200 * MIB)]),
    "500x256KiB": ("500 × 256 KiB", [(f"d{i // 100}/f{i:03d}.bin", 256 << 10) for i in range(500)]),
}
SMOKE_DATASET = ("smoke", [("a.bin", 8 * MIB + 17)] + [(f"sub/f{i}.bin", 70000 + i) for i in range(8)])
ECHO_VISITORS = 8
ECHO_SIZE = 16 << 10


def log(msg: str) -> None:
    print(f"wan: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the lab


def profiles(wanlab: str) -> dict[str, dict]:
    """The lab's named profiles, from `wanlab profiles` (defined once, in the lab)."""
    out = subprocess.run([wanlab, "profiles"], capture_output=True, text=True, timeout=10,
                         check=True).stdout
    got = {}
    for m in re.finditer(r"^(\w+): ([\d.]+) ms one way, ([\d.]+) Mbit/s, ([\d.]+)% loss$", out, re.M):
        got[m.group(1)] = {"delay_ms": float(m.group(2)), "rate_mbit": float(m.group(3)),
                           "loss_pct": float(m.group(4))}
    if not got:
        raise B.BenchError(f"`wanlab profiles` printed nothing this script understands: {out!r}")
    return got


def set_cubic(namespaces: list[str]) -> None:
    """cubic as the namespaces' default TCP congestion control, as on most hosts: what the
    peers and the `raw` row use, while Warren picks its own per socket. A namespace may only
    choose what the host allows, so cubic is allowed for the moment it is set (under a lock
    on the sysctl file, as crates/wanlab does) and the list is put back."""
    with open(ALLOWED_CC) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = Path(ALLOWED_CC).read_text().strip()
        added = "cubic" not in old.split()
        if added:
            Path(ALLOWED_CC).write_text(f"{old} cubic")
        try:
            for ns in namespaces:
                subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                                "net.ipv4.tcp_congestion_control=cubic"], check=True, timeout=10)
        finally:
            if added:
                Path(ALLOWED_CC).write_text(old)


class WanLab:
    """Two namespaces joined by `wanlab run`; this process enters side A. close() (also at
    exit) comes back, stops the line and deletes both namespaces; namespaces a killed run left
    behind are deleted at the next start (their PID is gone)."""

    def __init__(self, wanlab: str, profile: str, workdir: Path, queue_bdp: float = 1.0) -> None:
        if os.geteuid() != 0:
            raise B.BenchError("--wan needs root: it creates network namespaces and TUN devices")
        self._orig: int | None = None
        self._created: list[str] = []
        self.proc: subprocess.Popen | None = None
        for line in B.sh(["ip", "netns", "list"]).splitlines():
            m = re.match(re.escape(NS_PREFIX) + r"(\d+)-\w+-[ab]\b", line)
            if m and not B._pid_alive(int(m.group(1))):
                subprocess.run(["ip", "netns", "del", line.split()[0]], check=False)
        tag = secrets.token_hex(3)
        self.ns_a, self.ns_b = f"{NS_PREFIX}{os.getpid()}-{tag}-a", f"{NS_PREFIX}{os.getpid()}-{tag}-b"
        self.stats_path = workdir / f"wanlab-{profile}-{queue_bdp}.json"
        self.profile, self.queue_bdp = profile, queue_bdp
        try:
            for ns in (self.ns_a, self.ns_b):
                subprocess.run(["ip", "netns", "add", ns], check=True, timeout=20)
                self._created.append(ns)
                subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, timeout=20)
            set_cubic([self.ns_a, self.ns_b])
            self.proc = B.PROCS.start(
                [wanlab, "run", "--ns-a", self.ns_a, "--ns-b", self.ns_b, "--profile", profile,
                 "--queue-bdp", str(queue_bdp), "--stats-every", "250ms", "--stats-json",
                 str(self.stats_path), "--rt-priority", "10"], workdir / f"wanlab-{profile}.log")
            deadline = time.monotonic() + 20
            while not self.stats_path.exists():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise B.BenchError("wanlab did not come up: "
                                       + (workdir / f"wanlab-{profile}.log").read_text()[-500:])
                time.sleep(0.05)
            self._orig = os.open("/proc/self/ns/net", os.O_RDONLY)
            fd = os.open(B._netns_path(self.ns_a), os.O_RDONLY)
            try:
                B._setns(fd)
            finally:
                os.close(fd)
        except BaseException:
            self.close()
            raise
        B.NET.tunnel_host, B.NET.target_host = ADDR_A, ADDR_B
        B.NET.client_prefix = ["ip", "netns", "exec", self.ns_b]

    def stats(self) -> dict:
        for _ in range(20):  # the line rewrites the file every 250 ms
            try:
                return json.loads(self.stats_path.read_text())
            except (OSError, ValueError):
                time.sleep(0.05)
        raise B.BenchError(f"cannot read the lab's report {self.stats_path}")

    def close(self) -> None:
        B.NET.tunnel_host = B.NET.target_host = B.LOOPBACK
        B.NET.client_prefix = []
        if self._orig is not None:
            B._setns(self._orig)
            os.close(self._orig)
            self._orig = None
        if self.proc is not None:
            B.PROCS.stop(self.proc)
            self.proc = None
        while self._created:
            subprocess.run(["ip", "netns", "del", self._created.pop()], check=False, timeout=20)


def lab_delta(before: dict, after: dict) -> dict:
    """What the line saw between two reports: per direction, packets offered, queue drops
    (self-inflicted: the senders overfilled the bottleneck) and random drops (the profile's
    loss); the lab's CPU over the interval and whether it was CPU-bound at the end."""
    out = {}
    for d in ("a_to_b", "b_to_a"):
        a, b = before[d], after[d]
        sent = b["in_pkts"] - a["in_pkts"]
        q = b["queue_drops"] - a["queue_drops"]
        out[d] = {"pkts": sent, "queue_drops": q, "random_drops": b["random_drops"] - a["random_drops"],
                  "queue_drop_pct": 100.0 * q / sent if sent else 0.0,
                  "late_over_1ms": b["late_over_1ms"] - a["late_over_1ms"]}
    wall = after["elapsed_s"] - before["elapsed_s"]
    out["lab_cpu_pct"] = 100.0 * (after["cpu_s"] - before["cpu_s"]) / wall if wall > 0 else 0.0
    out["cpu_bound"] = bool(after.get("cpu_bound"))
    return out


# ---------------------------------------------------------------- figures


def fig_echo(host: str, port: int, seconds: float) -> dict:
    """ECHO_VISITORS connections, each sending ECHO_SIZE random bytes and reading them back
    (checked) in a loop for `seconds`; req/s over all, latency p50/p99."""
    payload = os.urandom(ECHO_SIZE)
    lats: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(ECHO_VISITORS + 1)
    end_at = [0.0]

    def visitor() -> None:
        mine = []
        try:
            with socket.create_connection((host, port), timeout=30) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                start.wait(60)
                while time.monotonic() < end_at[0]:
                    t = time.perf_counter()
                    s.sendall(payload)
                    got = bytearray()
                    while len(got) < ECHO_SIZE:
                        chunk = s.recv(ECHO_SIZE - len(got))
                        if not chunk:
                            raise OSError("the tunnel closed the connection mid-reply")
                        got += chunk
                    if got != payload:
                        raise OSError("the echo came back with different bytes")
                    mine.append(time.perf_counter() - t)
        except (OSError, threading.BrokenBarrierError) as e:
            with lock:
                errors.append(str(e))
            try:
                start.abort()
            except threading.BrokenBarrierError:
                pass
        with lock:
            lats.extend(mine)

    threads = [threading.Thread(target=visitor, daemon=True) for _ in range(ECHO_VISITORS)]
    for t in threads:
        t.start()
    try:
        end_at[0] = time.monotonic() + 1e9
        start.wait(60)
        t0 = time.monotonic()
        end_at[0] = t0 + seconds
    except threading.BrokenBarrierError:
        t0 = time.monotonic()
        end_at[0] = t0
    for t in threads:
        t.join(seconds + 120)
    elapsed = time.monotonic() - t0
    if errors:
        raise B.BenchError(f"echo: {len(errors)} visitor(s) failed: {errors[0]}")
    if not lats:
        raise B.BenchError("echo: no request completed")
    lats.sort()
    return {"echo_rps": len(lats) / elapsed, "echo_p50_ms": statistics.median(lats) * 1e3,
            "echo_p99_ms": lats[max(0, int(len(lats) * 0.99) - 1)] * 1e3, "echo_reqs": len(lats)}


def measure_config(name: str, lab: WanLab, svc: B.LocalServices, args, workdir: Path) -> dict:
    t = B.make_tunnel(name, workdir, args.bench_home, args.warren)
    res: dict = {"errors": []}
    try:
        visitors = t.start(svc.ports)
        host = t.visit_host
        res["ready_s"] = round(B.wait_forwarding(visitors["echo"], timeout=30, host=host), 3)
        time.sleep(0.3)

        def step(label: str, key: str, fn) -> None:
            before = lab.stats()
            try:
                if not t.alive():
                    raise B.BenchError("a tunnel process has exited")
                res.update(fn())
            except (B.BenchError, OSError, subprocess.SubprocessError) as e:
                res["errors"].append(f"{label}: {e}")
                log(f"{lab.profile} {name}: {label} failed: {e}")
            time.sleep(0.3)  # the line's next report includes the step's last packets
            res[f"{key}_lab"] = lab_delta(before, lab.stats())

        for key, extra in (("p1", []), ("p4", ["-P", "4"])):
            if key in args.modes:
                step(f"iperf3 {key}", key, lambda extra=extra, key=key: {
                    f"{key}_mbps": B.fig_iperf(t, visitors["iperf"], args.iperf_time, extra)["gbps"] * 1e3})
        if "echo" in args.modes:
            step("echo", "echo", lambda: fig_echo(host, visitors["echo"], args.echo_time))
        if not t.alive():
            res["errors"].append("a tunnel process exited during the run")
    except B.Unavailable as e:
        res["unavailable"] = str(e)
    except (B.BenchError, OSError, subprocess.SubprocessError) as e:
        res["errors"].append(f"start: {e}")
        log(f"{lab.profile} {name}: failed to start: {e}")
    finally:
        if res["errors"]:
            res["logs"] = t.logs()[-3000:]
        t.stop()
    return res


def measure_files(lab: WanLab, args, workdir: Path, datasets: dict, srcs: dict, sums: dict,
                  tools: list[str]) -> dict:
    """Each tool sends each data set from side A to side B (the receiving side runs there),
    every file hashed on arrival."""
    ctx: dict = {"workdir": workdir, "warren": args.warren, "recv_prefix": B.NET.client_prefix}
    out: dict = {}
    started = []
    try:
        if any(t.startswith("warren") for t in tools):
            ctx["server"] = F.WarrenServer(args.warren, workdir, host=ADDR_A)
            started.append(ctx["server"].proc)
        if any(t.startswith(("scp", "rsync")) for t in tools):
            ctx["sshd"] = _sshd(workdir)
            started.append(ctx["sshd"].proc)
        if "croc" in tools:
            ctx["croc"] = args.croc
            (workdir / "croc-home").mkdir(exist_ok=True)
            ctx["croc_relay"] = F.CrocRelay(args.croc, workdir, host=ADDR_A)
            started.append(ctx["croc_relay"].proc)
        for ds in datasets:
            for tool in tools:
                dst = workdir / "dst"
                shutil.rmtree(dst, ignore_errors=True)
                dst.mkdir()
                # The receiver in side B writes here; the filesystem is shared.
                before = lab.stats()
                try:
                    r = F.run_one(tool, ds, workdir / "src" / ds, srcs[ds], dst, ctx)
                    got = F.output_root(tool, dst, srcs[ds])
                    if srcs[ds].is_file():
                        F.verify_single(got, sums[ds])
                    else:
                        F.verify(got, sums[ds])
                    r["verified"] = True
                    log(f"{lab.profile} files {ds} {tool}: {r['wall_s']:.2f} s")
                except F.Failed as e:
                    r = {"error": str(e)[:1500]}
                    log(f"{lab.profile} files {ds} {tool}: FAILED: {str(e)[:400]}")
                time.sleep(0.3)
                r["lab"] = lab_delta(before, lab.stats())
                out.setdefault(ds, {})[tool] = r
                shutil.rmtree(dst, ignore_errors=True)
    finally:
        for p in started:
            B.PROCS.stop(p)
    return out


def _sshd(workdir: Path) -> F.Sshd:
    d = workdir / f"sshd-{secrets.token_hex(2)}"
    d.mkdir()
    return F.Sshd(d, host=ADDR_A)


def measure_fairness(args, workdir: Path, queue_bdp: float) -> dict:
    """W1 with the queue at `queue_bdp`: a Warren default-config flow (through the tunnel)
    and a plain cubic flow (no tunnel) share the link for args.fair_time seconds."""
    lab = WanLab(args.wanlab, "W1", workdir, queue_bdp)
    res: dict = {"queue_bdp": queue_bdp}
    try:
        svc = B.LocalServices(workdir, with_sockperf=False)
        extra = B.free_port()
        other = B.PROCS.start(B.NET.client_prefix + ["iperf3", "-s", "-B", ADDR_B, "-p", str(extra)],
                              workdir / "iperf3-fair.log")
        B.wait_listening(extra, host=ADDR_B)
        t = B.make_tunnel("warren-default", workdir, args.bench_home, args.warren)
        try:
            visitors = t.start(svc.ports)
            B.wait_forwarding(visitors["echo"], timeout=30)
            before = lab.stats()
            secs = str(args.fair_time)
            flows = {
                "warren": ["iperf3", "-c", B.LOOPBACK, "-p", str(visitors["iperf"]), "-t", secs, "-J"],
                "cubic": ["iperf3", "-c", ADDR_B, "-p", str(extra), "-t", secs, "-J", "-C", "cubic"],
            }
            procs = {k: subprocess.Popen(v, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for k, v in flows.items()}
            for k, p in procs.items():
                out, err = p.communicate(timeout=args.fair_time + 60)
                try:
                    recv = json.loads(out)["end"]["sum_received"]
                    res[f"{k}_mbps"] = recv["bits_per_second"] / 1e6
                except (ValueError, KeyError) as e:
                    raise B.BenchError(f"fairness iperf3 ({k}) failed: {e}: {out[-300:]} {err[-300:]}")
            time.sleep(0.3)
            res["lab"] = lab_delta(before, lab.stats())
        finally:
            t.stop()
            B.PROCS.stop(other)
            svc.stop()
    finally:
        lab.close()
    return res


# ---------------------------------------------------------------- run


def cmd_run(args) -> int:
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, B._on_signal)
    B.raise_nofile()
    args.warren = args.warren or str(REPO / "target/release/warren")
    args.wanlab = args.wanlab or str(REPO / "target/release/wanlab")
    args.bench_home = Path(args.bench_home)
    known = profiles(args.wanlab)
    if args.smoke:
        args.profiles, args.runs, args.iperf_time, args.echo_time = "W2", 1, 3, 2
        args.only = args.only or "raw,warren-default"
        args.files = args.files or "warren-direct"
        args.no_fairness = True
    names = args.profiles.split(",")
    for n in names:
        if n not in known:
            log(f"unknown profile {n}; the lab has {', '.join(known)}")
            return 2
    configs = args.only.split(",") if args.only else CONFIGS
    for c in configs:
        if c not in LABELS:
            log(f"unknown config {c}; known: {', '.join(CONFIGS)}")
            return 2
    tools = [] if args.files == "none" else (args.files.split(",") if args.files else FILE_TOOLS)
    if "croc" in tools:
        try:
            args.croc = B.tool("croc", args.bench_home)
        except B.BenchError as e:
            log(f"{e}; files without croc")
            tools.remove("croc")
    datasets = {"smoke": SMOKE_DATASET} if args.smoke else DATASETS
    workdir = Path(tempfile.mkdtemp(prefix="warren-wan-bench-"))
    started = dt.datetime.now(dt.timezone.utc)
    doc = {
        "kind": "wan", "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": B.machine_info(),
        "versions": B.versions(args.bench_home, args.warren, configs),
        "settings": {"profiles": {n: known[n] for n in names}, "runs": args.runs,
                     "iperf_time": args.iperf_time, "echo_time": args.echo_time,
                     "echo": f"{ECHO_VISITORS} visitors × {ECHO_SIZE >> 10} KiB",
                     "configs": configs, "file_tools": tools,
                     "datasets": {n: {"label": d[0], "files": len(d[1]), "bytes": sum(s for _, s in d[1])}
                                  for n, d in datasets.items()},
                     "smoke": args.smoke},
        "runs": [], "files": [], "fairness": [], "loadavg": [],
    }
    failures = 0
    try:
        srcs, sums = {}, {}
        if tools:
            for n, (_label, files) in datasets.items():
                root = workdir / "src" / n
                sums[n] = F.make_dataset(root, files)
                srcs[n] = root / files[0][0] if len(files) == 1 else root
        for run in range(args.runs):
            doc["loadavg"].append(round(B.loadavg(), 2))
            log(f"run {run + 1}/{args.runs} (load average {doc['loadavg'][-1]})")
            per_profile, per_files = {}, {}
            for prof in names:
                lab = WanLab(args.wanlab, prof, workdir)
                try:
                    svc = B.LocalServices(workdir, with_sockperf=False)
                    try:
                        per_profile[prof] = {}
                        for cfg in configs:
                            r = measure_config(cfg, lab, svc, args, workdir / prof)
                            per_profile[prof][cfg] = r
                            failures += bool(r["errors"])
                            log(f"{prof} {cfg}: " + " ".join(
                                f"{k}={r[k]:.1f}" for k in ("p1_mbps", "p4_mbps", "echo_rps", "echo_p99_ms")
                                if k in r) + (f" ({len(r['errors'])} errors)" if r["errors"] else ""))
                    finally:
                        svc.stop()
                    if tools:
                        per_files[prof] = measure_files(lab, args, workdir, datasets, srcs, sums, tools)
                        failures += sum("error" in r for ds in per_files[prof].values() for r in ds.values())
                finally:
                    lab.close()
            doc["runs"].append(per_profile)
            doc["files"].append(per_files)
        if not args.no_fairness:
            for q in (0.5, 2.0):
                try:
                    doc["fairness"].append(measure_fairness(args, workdir, q))
                    log(f"fairness at {q} BDP: {doc['fairness'][-1]}")
                except (B.BenchError, OSError, subprocess.SubprocessError) as e:
                    failures += 1
                    doc["fairness"].append({"queue_bdp": q, "error": str(e)})
                    log(f"fairness at {q} BDP failed: {e}")
    finally:
        B.PROCS.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    doc["minutes"] = round((dt.datetime.now(dt.timezone.utc) - started).total_seconds() / 60, 1)
    print(render(doc))
    if args.smoke:
        warren = doc["runs"][0]["W2"].get("warren-default", {})
        if warren.get("p1_mbps", 0) <= 0 or warren.get("echo_reqs", 0) <= 0:
            log("smoke: Warren moved nothing across the lab")
            return 1
    elif not args.no_json:
        out = HERE / "results" / f"wan-{started.strftime('%Y%m%d-%H%M%S')}.json"
        out.write_text(json.dumps(doc, indent=1) + "\n")
        log(f"wrote {out.relative_to(REPO)}")
        if args.write_results:
            write_results(doc)
    if failures:
        log(f"{failures} measurement(s) failed")
        return 1
    return 0


# ---------------------------------------------------------------- rendering


def med(doc: dict, prof: str, cfg: str, key: str) -> float | None:
    vals = [run[prof][cfg][key] for run in doc["runs"] if key in run.get(prof, {}).get(cfg, {})]
    return statistics.median(vals) if vals else None


def med_lab(doc: dict, prof: str, cfg: str, step: str, field: str, d: str = "a_to_b") -> float | None:
    vals = [run[prof][cfg][f"{step}_lab"][d][field] for run in doc["runs"]
            if f"{step}_lab" in run.get(prof, {}).get(cfg, {})]
    return statistics.median(vals) if vals else None


def med_ratio(doc: dict, prof: str, a: str, b: str, key: str) -> float | None:
    vals = []
    for run in doc["runs"]:
        x, y = run.get(prof, {}).get(a, {}).get(key), run.get(prof, {}).get(b, {}).get(key)
        if x is not None and y:
            vals.append(x / y)
    return statistics.median(vals) if vals else None


def med_file(doc: dict, prof: str, ds: str, tool: str) -> float | None:
    vals = [run[prof][ds][tool]["wall_s"] for run in doc["files"]
            if "wall_s" in run.get(prof, {}).get(ds, {}).get(tool, {})
            and "error" not in run[prof][ds][tool]]
    return statistics.median(vals) if vals else None


def fmt(v, spec="{:.1f}") -> str:
    return "—" if v is None else spec.format(v)


def render(doc: dict, heading: str = "##") -> str:
    st = doc["settings"]
    lines = [f"{heading} Across the WAN lab (issue 44)", "",
             f"{doc['date']}, {doc['machine']['cpu']} ({doc['machine']['cores']} cores), "
             f"Warren {doc['versions'].get('warren', '?')} ({doc['versions'].get('warren commit', '')}), "
             f"{st['runs']} run(s), medians; iperf3 {st['iperf_time']} s per figure, echo "
             f"{st['echo']} for {st['echo_time']} s; load averages {doc['loadavg']}. "
             "Tunnel servers and visitors in one namespace, tunnel clients and the services in "
             "the other, joined by crates/wanlab's delay line (drop-tail queue of 1 BDP); the "
             "namespaces' own TCP congestion control is cubic, as on most hosts. `drops` is "
             "the share of the P1 flow's packets that the bottleneck queue dropped "
             "(self-inflicted, not the profile's random loss); `lab CPU` the delay line's own "
             "CPU during P1 (a figure near 100 % would mean the lab, not the path, limited it).",
             ""]
    for prof, p in st["profiles"].items():
        link = p["rate_mbit"]
        lines += [f"{heading}# {prof}: {p['delay_ms']:g} ms one way, {link:g} Mbit/s, {p['loss_pct']:g} % loss", "",
                  "| config | P1 Mbit/s | P4 Mbit/s | echo req/s | echo p50 ms | echo p99 ms | drops P1 | drops P4 | lab CPU |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for cfg in st["configs"]:
            runs = [run.get(prof, {}).get(cfg, {}) for run in doc["runs"]]
            if runs and all("unavailable" in r for r in runs):
                lines.append(f"| {LABELS[cfg]} | not available with this binary | | | | | | | |")
                continue
            lines.append(
                f"| {LABELS[cfg]} | {fmt(med(doc, prof, cfg, 'p1_mbps'))} | {fmt(med(doc, prof, cfg, 'p4_mbps'))} "
                f"| {fmt(med(doc, prof, cfg, 'echo_rps'))} | {fmt(med(doc, prof, cfg, 'echo_p50_ms'), '{:.0f}')} "
                f"| {fmt(med(doc, prof, cfg, 'echo_p99_ms'), '{:.0f}')} "
                f"| {fmt(med_lab(doc, prof, cfg, 'p1', 'queue_drop_pct'), '{:.1f} %')} "
                f"| {fmt(med_lab(doc, prof, cfg, 'p4', 'queue_drop_pct'), '{:.1f} %')} "
                f"| {fmt(_lab_cpu(doc, prof, cfg), '{:.0f} %')} |")
        files = [f for f in doc.get("files", []) if prof in f]
        if files:
            rate_bytes = link * 1e6 / 8
            lines += ["", "| files (side A → side B) | " + " | ".join(
                st["datasets"][ds]["label"] for ds in st["datasets"]) + " |",
                "|---|" + "---|" * len(st["datasets"])]
            ideal = " | ".join(f"{st['datasets'][ds]['bytes'] / rate_bytes:.1f} s" for ds in st["datasets"])
            lines.append(f"| ideal (bytes / rate) | {ideal} |")
            for tool in st["file_tools"]:
                cells = []
                for ds in st["datasets"]:
                    v = med_file(doc, prof, ds, tool)
                    ideal_s = st["datasets"][ds]["bytes"] / rate_bytes
                    cells.append("failed" if v is None else f"{v:.1f} s ({v / ideal_s:.2f}× ideal)")
                lines.append(f"| {F.LABELS.get(tool, tool)} | " + " | ".join(cells) + " |")
        lines += ["", *_targets(doc, prof), ""]
    fair = [f for f in doc.get("fairness", [])]
    if fair:
        lines += [f"{heading}# Fairness on W1: one Warren default-config flow beside one plain cubic flow", "",
                  "| queue | Warren Mbit/s | cubic Mbit/s | cubic's share of the link | queue drops |",
                  "|---|---|---|---|---|"]
        link = doc["settings"]["profiles"].get("W1", {}).get("rate_mbit", 100.0)
        for f in fair:
            if "error" in f:
                lines.append(f"| {f['queue_bdp']} BDP | failed: {f['error'][:120]} | | | |")
                continue
            lines.append(f"| {f['queue_bdp']:g} BDP | {f['warren_mbps']:.1f} | {f['cubic_mbps']:.1f} "
                         f"| {100 * f['cubic_mbps'] / link:.0f} % (target ≥ 30 %) "
                         f"| {f['lab']['a_to_b']['queue_drop_pct']:.1f} % |")
        lines.append("")
    return "\n".join(lines)


def _lab_cpu(doc: dict, prof: str, cfg: str) -> float | None:
    vals = [run[prof][cfg]["p1_lab"]["lab_cpu_pct"] for run in doc["runs"]
            if "p1_lab" in run.get(prof, {}).get(cfg, {})]
    return statistics.median(vals) if vals else None


def _targets(doc: dict, prof: str) -> list[str]:
    """The issue's targets for this profile, each with its figure and met / not met."""
    link = doc["settings"]["profiles"][prof]["rate_mbit"]
    out = []

    def line(text: str, v: float | None, ok) -> None:
        if v is None:
            return
        out.append(f"- {text}: {v:.2f} — {'met' if ok(v) else '**not met**'}")

    p1 = med(doc, prof, "warren-default", "p1_mbps")
    p4 = med(doc, prof, "warren-default", "p4_mbps")
    if prof in ("W2", "W3"):
        line("default P1 / link rate (target ≥ 0.80)", p1 / link if p1 else None, lambda v: v >= 0.80)
    if prof == "W2":
        line("default P4 / link rate (target ≥ 0.85)", p4 / link if p4 else None, lambda v: v >= 0.85)
        for peer in ("rathole-tcp", "frp-tls", "frp-quic"):
            line(f"default P1 / {peer} (target ≥ 10)", med_ratio(doc, prof, "warren-default", peer, "p1_mbps"),
                 lambda v: v >= 10)
        line("default echo p99 / rathole tcp's (target ≤ 0.5)",
             med_ratio(doc, prof, "warren-default", "rathole-tcp", "echo_p99_ms"), lambda v: v <= 0.5)
        q1 = med(doc, prof, "warren-quic", "p1_mbps")
        line("quic P1 / link rate (target ≥ 0.6)", q1 / link if q1 else None, lambda v: v >= 0.6)
        line("quic P1 self-inflicted drops, % (target ≤ 2)",
             med_lab(doc, prof, "warren-quic", "p1", "queue_drop_pct"), lambda v: v <= 2)
        line("quic echo req/s / the default's (target ≥ 0.8)",
             med_ratio(doc, prof, "warren-quic", "warren-default", "echo_rps"), lambda v: v >= 0.8)
    if prof in ("W1", "W4"):
        line("default P1 / no tunnel (target ≥ 0.95)", med_ratio(doc, prof, "warren-default", "raw", "p1_mbps"),
             lambda v: v >= 0.95)
    if prof == "W1":
        for cfg in ("warren-default", "warren-quic"):
            for step in ("p1", "p4"):
                line(f"{cfg} {step.upper()} self-inflicted drops, % (target ≤ 2)",
                     med_lab(doc, prof, cfg, step, "queue_drop_pct"), lambda v: v <= 2)
    rate_bytes = link * 1e6 / 8
    ds = doc["settings"]["datasets"]
    big = med_file(doc, prof, "200MiB", "warren-direct") if "200MiB" in ds else None
    if big is not None:
        want = {"W2": 1.3, "W1": 1.15, "W4": 1.15}.get(prof)
        if want:
            line(f"warren send 200 MiB / ideal (target ≤ {want})", big / (ds["200MiB"]["bytes"] / rate_bytes),
                 lambda v, w=want: v <= w)
        many = med_file(doc, prof, "500x256KiB", "warren-direct")
        if many is not None and prof in ("W1", "W4"):
            per_byte = (many / ds["500x256KiB"]["bytes"]) / (big / ds["200MiB"]["bytes"])
            line("500 × 256 KiB time per byte / 200 MiB's (target ≤ 1.2)", per_byte, lambda v: v <= 1.2)
            rs = med_file(doc, prof, "500x256KiB", "rsync")
            if rs:
                line("500 × 256 KiB Warren / rsync (target ≤ 1)", many / rs, lambda v: v <= 1)
    return out


def readme_table(doc: dict) -> str:
    st = doc["settings"]
    profs = list(st["profiles"])
    head = "| config | " + " | ".join(
        f"{p} P1 / P4 Mbit/s" for p in profs) + " |"
    rows = [head, "|---|" + "---|" * len(profs)]
    for cfg in st["configs"]:
        cells = [f"{fmt(med(doc, p, cfg, 'p1_mbps'), '{:.0f}')} / {fmt(med(doc, p, cfg, 'p4_mbps'), '{:.0f}')}"
                 for p in profs]
        rows.append(f"| {LABELS[cfg]} | " + " | ".join(cells) + " |")
    legend = "; ".join(f"{p} = {v['delay_ms']:g} ms one way, {v['rate_mbit']:g} Mbit/s, {v['loss_pct']:g} % loss"
                       for p, v in st["profiles"].items())
    return (f"Across the WAN lab ({legend}), {doc['date']}, medians of {st['runs']}; echo, files, "
            "drops and fairness in [bench/RESULTS.md](bench/RESULTS.md#across-the-wan-lab-issue-44).\n\n"
            + "\n".join(rows) + "\n")


def write_results(doc: dict) -> None:
    # After bench.py's "## Scale", where a loopback run keeps the other harnesses' sections.
    B.replace_section(SECTION, render(doc))
    readme = REPO / "README.md"
    rt = readme.read_text()
    if README_START in rt and README_END in rt:
        a, b = rt.index(README_START) + len(README_START), rt.index(README_END)
        readme.write_text(rt[:a] + "\n" + readme_table(doc) + rt[b:])
        log("wrote README.md's WAN table")
    else:
        log(f"README.md has no {README_START} … {README_END} markers; its WAN table was not written")
    log("wrote bench/RESULTS.md's WAN section")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure")
    r.add_argument("--smoke", action="store_true", help="W2, raw + Warren default, short, one small file")
    r.add_argument("--profiles", default="W1,W2,W3,W4", help="comma-separated lab profiles")
    r.add_argument("--only", help=f"comma-separated configs (default: {','.join(CONFIGS)})")
    r.add_argument("--files", help=f"comma-separated file tools, or none (default: {','.join(FILE_TOOLS)})")
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--iperf-time", type=int, default=10)
    r.add_argument("--echo-time", type=float, default=10.0)
    r.add_argument("--fair-time", type=int, default=20)
    r.add_argument("--modes", default="p1,p4,echo", help="which of p1,p4,echo to run")
    r.add_argument("--no-fairness", action="store_true")
    r.add_argument("--no-json", action="store_true")
    r.add_argument("--write-results", action="store_true")
    r.add_argument("--warren", help="the warren binary (default target/release/warren)")
    r.add_argument("--wanlab", help="the wanlab binary (default target/release/wanlab)")
    r.add_argument("--bench-home", default=os.environ.get("WARREN_BENCH_HOME",
                                                          str(Path.home() / ".cache/warren-bench")))
    rr = sub.add_parser("render", help="print (or write) the tables from a results JSON")
    rr.add_argument("json")
    rr.add_argument("--write-results", action="store_true")
    args = ap.parse_args()
    if args.cmd == "render":
        doc = json.loads(Path(args.json).read_text())
        if args.write_results:
            write_results(doc)
        else:
            print(render(doc))
        return 0
    return cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
