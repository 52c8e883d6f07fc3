#!/usr/bin/env python3
"""Scale measurements of Warren (issue 21) on this machine, everything on 127.0.0.1.

    bench/scale.py [--only services,sessions,streams] [--services 10000] [--clients 1000]
                   [--per-client 10] [--streams 10000] [--idle-seconds 30]
                   [--stream-seconds 10] [--json OUT.json]

1. services: one server with N TCP services and one client serving them all. Time from the
   client's start to its `session_started` log event; RSS of server and client with N
   services against 1 service (VmRSS, /proc/PID/status), per service; a reload that adds one
   service to N (server, then client) and what it says it touched; the admin API and
   /metrics at that size.
2. sessions: one server, C in-process clients of S services each (the `scale_load`
   example); all sessions up; server RSS per idle session (with C sessions against none);
   idle CPU of the server over --idle-seconds with every heartbeat running (utime+stime
   from /proc/PID/stat).
3. streams: concurrent visitor streams through one session, each writing as fast as it
   can into a sink behind the client; RSS per stream (server, client) and per-stream
   throughput (min/p10/median/p90/max, streams that got nothing). One stream holds two
   descriptors in the server (visitor, data channel): the count is cut to fit the hard
   open-file limit, and the report says so.

Needs the release binary and example (`cargo build --release -p warren --bins --example
scale_load`; WARREN_BIN / SCALE_LOAD_BIN override). Python 3 standard library only. Every
process started is stopped by its PID; every wait has a timeout; the script ends by itself.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import secrets
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
LOOPBACK = "127.0.0.1"
# Service ports come from here up (configs refuse port 0); below the ephemeral range.
FIRST_SERVICE_PORT = 20000


class BenchError(Exception):
    pass


class Procs:
    """Every process this script starts; each is stopped by its own PID."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], logfile: Path, stdout=None) -> subprocess.Popen:
        log = open(logfile, "ab")
        p = subprocess.Popen(argv, stdout=stdout or log, stderr=log, stdin=subprocess.DEVNULL,
                             start_new_session=True, text=stdout is not None)
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen | None) -> None:
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            self.stop(p)


PROCS = Procs()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def service_ports(n: int) -> list[int]:
    """`n` ports from FIRST_SERVICE_PORT up that are free now."""
    ports, port = [], FIRST_SERVICE_PORT
    while len(ports) < n:
        if port >= 32768:
            raise BenchError(f"fewer than {n} free ports between {FIRST_SERVICE_PORT} and 32767")
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((LOOPBACK, port))
                ports.append(port)
            except OSError:
                pass
        port += 1
    return ports


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_for(what: str, check, timeout: float, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise BenchError(f"{what}: not within {timeout:.0f} s")


def http(port: int, path: str, method: str = "GET", timeout: float = 30.0):
    """(status, headers, body bytes, seconds) of an admin API request."""
    req = urllib.request.Request(f"http://{LOOPBACK}:{port}{path}", method=method, data=b"" if method == "POST" else None)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
            return r.status, dict(r.headers), body, time.monotonic() - started
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read(), time.monotonic() - started


def admin_up(port: int) -> bool:
    try:
        return http(port, "/api/v1/status", timeout=2)[0] == 200
    except OSError:
        return False


def log_events(path: Path, event: str) -> list[dict]:
    found = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        if f'"{event}"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("fields", {}).get("event") == event:
            found.append(entry)
    return found


def stamp(entry: dict) -> float:
    return dt.datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp()


class Echo(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.settimeout(10)
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass


def start_echo() -> tuple[Echo, int]:
    server = Echo((LOOPBACK, 0), EchoHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def echo_ok(port: int) -> bool:
    payload = secrets.token_bytes(4096)
    try:
        with socket.create_connection((LOOPBACK, port), timeout=5) as s:
            s.sendall(payload)
            got = b""
            while len(got) < len(payload):
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
            return got == payload
    except OSError:
        return False


class Pair:
    """A warren server and client from generated configs, with admin APIs and JSON logs."""

    def __init__(self, warren: str, work: Path, tag: str) -> None:
        self.warren, self.dir, self.tag = warren, work / tag, tag
        self.dir.mkdir()
        self.psk, self.token = secrets.token_hex(16), secrets.token_hex(16)
        self.port, self.server_admin, self.client_admin = free_port(), free_port(), free_port()
        self.server = self.client = None

    def server_toml(self, services: dict[str, int]) -> str:
        lines = [f'[server]\nbind = "{LOOPBACK}:{self.port}"\npsk = "{self.psk}"\n'
                 f'default_token = "{self.token}"\ntransport = "noise"\n'
                 f'\n[admin]\nbind = "{LOOPBACK}:{self.server_admin}"\n']
        lines += [f'\n[server.services.{n}]\nbind = "{LOOPBACK}:{p}"\n' for n, p in services.items()]
        return "".join(lines)

    def client_toml(self, services: dict[str, int]) -> str:
        lines = [f'[client]\nserver = "{LOOPBACK}:{self.port}"\npsk = "{self.psk}"\n'
                 f'default_token = "{self.token}"\ntransport = "noise"\n'
                 'reconnect_initial_delay = "100ms"\n'
                 f'\n[admin]\nbind = "{LOOPBACK}:{self.client_admin}"\n']
        lines += [f'\n[client.services.{n}]\ntarget = "{LOOPBACK}:{p}"\n' for n, p in services.items()]
        return "".join(lines)

    def start_server(self, services: dict[str, int]) -> None:
        (self.dir / "server.toml").write_text(self.server_toml(services))
        self.server = PROCS.start([self.warren, "--log-format", "json", "server",
                                   str(self.dir / "server.toml")], self.dir / "server.log")
        wait_for(f"{self.tag}: server admin API", lambda: admin_up(self.server_admin), 120)

    def start_client(self, targets: dict[str, int]) -> float:
        """Starts the client; returns the wall-clock time just before the spawn."""
        (self.dir / "client.toml").write_text(self.client_toml(targets))
        t0 = time.time()
        self.client = PROCS.start([self.warren, "--log-format", "json", "client",
                                   str(self.dir / "client.toml")], self.dir / "client.log")
        return t0

    def session_started(self, timeout: float) -> dict:
        return wait_for(f"{self.tag}: client session_started",
                        lambda: (log_events(self.dir / "client.log", "session_started") or [None])[0],
                        timeout, every=0.01)

    def stop(self) -> None:
        PROCS.stop(self.client)
        PROCS.stop(self.server)


def settle(seconds: float = 2.0) -> None:
    time.sleep(seconds)


# ---------------------------------------------------------------------------------------
# 1. N services, one client


def one_run(warren: str, work: Path, n: int, echo_port: int, tag: str, extra: bool) -> dict:
    pair = Pair(warren, work, tag)
    ports = service_ports(n + 1)
    names = [f"svc{i}" for i in range(n)]
    services = dict(zip(names, ports))
    pair.start_server(services)
    settle()
    out = {"services": n, "server_rss_alone_kib": rss_kib(pair.server.pid)}
    t0 = pair.start_client({name: echo_port for name in names})
    started = pair.session_started(300)
    client_started = (log_events(pair.dir / "client.log", "client_started") or [None])[0]
    out["session_up_after_spawn_s"] = round(stamp(started) - t0, 3)
    if client_started:
        out["session_up_after_client_started_s"] = round(stamp(started) - stamp(client_started), 3)
    settle()
    out["server_rss_kib"] = rss_kib(pair.server.pid)
    out["client_rss_kib"] = rss_kib(pair.client.pid)
    out["server_fds"] = fds(pair.server.pid)
    out["bytes_ok"] = all(echo_ok(ports[i]) for i in sorted({0, n // 2, n - 1}))
    out["server_log_lines"] = len((pair.dir / "server.log").read_text().splitlines())
    out["client_log_lines"] = len((pair.dir / "client.log").read_text().splitlines())
    if extra:
        status, headers, body, took = http(pair.server_admin, "/metrics")
        out["metrics_scrape_s"] = round(took, 3)
        out["metrics_bytes"] = len(body)
        settle(1)
        out["server_rss_after_scrape_kib"] = rss_kib(pair.server.pid)
        status, headers, body, took = http(pair.server_admin, "/api/v1/services")
        out["services_page_s"] = round(took, 3)
        out["services_page_len"] = len(json.loads(body))
        out["services_total_header"] = headers.get("X-Total-Count") or headers.get("x-total-count")
        status, headers, body, took = http(pair.client_admin, "/api/v1/services?limit=1000&offset=9000")
        out["client_services_page_s"] = round(took, 3)
        # A reload that adds one service to the server, then to the client.
        added = f"svc{n}"
        services[added] = ports[n]
        (pair.dir / "server.toml").write_text(pair.server_toml(services))
        status, _, body, took = http(pair.server_admin, "/api/v1/reload", "POST", timeout=120)
        reply = json.loads(body)
        out["server_reload"] = {"status": status, "s": round(took, 3),
                                "applied": reply.get("applied"), "summary": reply.get("summary")}
        (pair.dir / "client.toml").write_text(pair.client_toml({name: echo_port for name in services}))
        sessions_before = len(log_events(pair.dir / "client.log", "session_started"))
        status, _, body, took = http(pair.client_admin, "/api/v1/reload", "POST", timeout=120)
        reply = json.loads(body)
        out["client_reload"] = {"status": status, "s": round(took, 3),
                                "applied": reply.get("applied"), "summary": reply.get("summary")}
        wait_for("the added service serves", lambda: echo_ok(ports[n]), 60, every=0.2)
        out["client_reload"]["sessions_started"] = (
            len(log_events(pair.dir / "client.log", "session_started")) - sessions_before)
        out["added_service_bytes_ok"] = True
    pair.stop()
    return out


def bench_services(warren: str, work: Path, n: int) -> dict:
    echo, echo_port = start_echo()
    try:
        base = one_run(warren, work, 1, echo_port, "svc-1", extra=False)
        big = one_run(warren, work, n, echo_port, f"svc-{n}", extra=True)
    finally:
        echo.shutdown()
    per = lambda key: round((big[key] - base[key]) / (n - 1), 2)
    return {"base": base, "big": big,
            "server_kib_per_service_alone": per("server_rss_alone_kib"),
            "server_kib_per_service": per("server_rss_kib"),
            "client_kib_per_service": per("client_rss_kib")}


# ---------------------------------------------------------------------------------------
# 2. C clients of S services


def bench_sessions(warren: str, load: str, work: Path, clients: int, per: int, idle: int) -> dict:
    echo, echo_port = start_echo()
    pair = Pair(warren, work, f"sessions-{clients}")
    names = [f"c{i}s{j}" for i in range(clients) for j in range(per)]
    pair.start_server(dict(zip(names, service_ports(len(names)))))
    out: dict = {"clients": clients, "services_each": per}
    try:
        settle(3)
        pid = pair.server.pid
        out["server_rss_no_sessions_kib"] = rss_kib(pid)
        c0 = cpu_seconds(pid)
        time.sleep(10)
        out["server_cpu_pct_no_sessions"] = round((cpu_seconds(pid) - c0) / 10 * 100, 3)
        hold = idle + 120
        loader = PROCS.start([load, "clients", f"{LOOPBACK}:{pair.port}", pair.psk, pair.token,
                              str(clients), str(per), f"{LOOPBACK}:{echo_port}", str(hold)],
                             pair.dir / "load.log", stdout=subprocess.PIPE)
        line = read_line(loader, "ready", 600)
        out["all_up_s"] = float(line.split()[1])
        status, headers, body, _ = http(pair.server_admin, "/api/v1/sessions?limit=1")
        out["server_sessions"] = int(headers.get("X-Total-Count") or headers.get("x-total-count") or -1)
        settle(5)
        out["server_rss_kib"] = rss_kib(pid)
        out["server_fds"] = fds(pid)
        c0, l0, t0 = cpu_seconds(pid), cpu_seconds(loader.pid), time.monotonic()
        time.sleep(idle)
        elapsed = time.monotonic() - t0
        out["idle_window_s"] = round(elapsed, 1)
        out["server_cpu_pct"] = round((cpu_seconds(pid) - c0) / elapsed * 100, 3)
        out["clients_process_cpu_pct"] = round((cpu_seconds(loader.pid) - l0) / elapsed * 100, 3)
        out["server_kib_per_session"] = round(
            (out["server_rss_kib"] - out["server_rss_no_sessions_kib"]) / clients, 2)
        _, _, body, took = http(pair.server_admin, "/api/v1/sessions")
        out["sessions_page_s"] = round(took, 3)
        _, _, body, took = http(pair.server_admin, "/metrics")
        out["metrics_scrape_s"] = round(took, 3)
        status, headers, body, _ = http(pair.server_admin, "/api/v1/sessions?limit=1")
        out["server_sessions_after"] = int(headers.get("X-Total-Count") or headers.get("x-total-count") or -1)
        PROCS.stop(loader)
    finally:
        pair.stop()
        echo.shutdown()
    return out


def read_line(proc: subprocess.Popen, prefix: str, timeout: float) -> str:
    """The first stdout line of `proc` starting with `prefix` (other lines are kept)."""
    box: list[str] = []

    def reader() -> None:
        for line in proc.stdout:
            if line.startswith(prefix):
                box.append(line.strip())
                return
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        raise BenchError(f"no `{prefix}` line from {proc.args[0]} within {timeout:.0f} s "
                         f"(exit code {proc.poll()})")
    return box[0]


# ---------------------------------------------------------------------------------------
# 3. concurrent streams through one session


def bench_streams(warren: str, load: str, work: Path, wanted: int, seconds: int) -> dict:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    # Server: a visitor socket and a data channel per stream; the load process: a visitor
    # and a sink connection per stream. Keep 600 descriptors for everything else.
    fit = (hard - 600) // 2
    count = min(wanted, fit)
    out: dict = {"wanted": wanted, "streams": count, "nofile_hard_limit": hard}
    if count < wanted:
        out["cut_because"] = (f"{wanted} streams need about {2 * wanted + 600} descriptors in the "
                              f"server process; the hard limit here is {hard}")
    services = 10  # a service opens at most 4096 streams at once
    pair = Pair(warren, work, f"streams-{count}")
    names = [f"st{i}" for i in range(services)]
    ports = service_ports(services)
    sink = free_port()
    pair.start_server(dict(zip(names, ports)))
    try:
        pair.start_client({name: sink for name in names})
        pair.session_started(60)
        settle(3)
        s_idle, c_idle = rss_kib(pair.server.pid), rss_kib(pair.client.pid)
        out.update(server_rss_idle_kib=s_idle, client_rss_idle_kib=c_idle)
        loader = PROCS.start([load, "streams", f"{LOOPBACK}:{sink}", str(seconds), str(count)]
                             + [f"{LOOPBACK}:{p}" for p in ports], pair.dir / "load.log",
                             stdout=subprocess.PIPE)
        opened = read_line(loader, "open", 400)
        out["opened"] = opened
        read_line(loader, "measuring", 60)
        time.sleep(seconds / 2)
        s_busy, c_busy = rss_kib(pair.server.pid), rss_kib(pair.client.pid)
        out.update(server_rss_active_kib=s_busy, client_rss_active_kib=c_busy,
                   server_fds_active=fds(pair.server.pid))
        result = json.loads(read_line(loader, "{", seconds + 60))
        out["throughput"] = result
        out["server_kib_per_stream"] = round((s_busy - s_idle) / count, 2)
        out["client_kib_per_stream"] = round((c_busy - c_idle) / count, 2)
        PROCS.stop(loader)
    finally:
        pair.stop()
    return out


# ---------------------------------------------------------------------------------------


def machine() -> dict:
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // (1024 * 1024)
    return {"cpu": model, "cores": os.cpu_count(), "mem_gib": mem, "kernel": platform.release(),
            "load_before": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="services,sessions,streams")
    ap.add_argument("--services", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--per-client", type=int, default=10)
    ap.add_argument("--streams", type=int, default=10_000)
    ap.add_argument("--idle-seconds", type=int, default=30)
    ap.add_argument("--stream-seconds", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    warren = os.environ.get("WARREN_BIN", str(REPO / "target/release/warren"))
    load = os.environ.get("SCALE_LOAD_BIN", str(REPO / "target/release/examples/scale_load"))
    for exe in (warren, load):
        if not os.access(exe, os.X_OK):
            print(f"{exe} is missing: cargo build --release -p warren --bins --example scale_load",
                  file=sys.stderr)
            return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    report = {"machine": machine(), "warren": warren, "date": dt.datetime.now(dt.timezone.utc).isoformat()}
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="warren-scale-") as tmp:
        work = Path(tmp)
        try:
            if "services" in only:
                report["services"] = bench_services(warren, work, args.services)
                print(json.dumps({"services": report["services"]}, indent=1), flush=True)
            if "sessions" in only:
                report["sessions"] = bench_sessions(warren, load, work, args.clients,
                                                    args.per_client, args.idle_seconds)
                print(json.dumps({"sessions": report["sessions"]}, indent=1), flush=True)
            if "streams" in only:
                report["streams"] = bench_streams(warren, load, work, args.streams,
                                                  args.stream_seconds)
                print(json.dumps({"streams": report["streams"]}, indent=1), flush=True)
        except BenchError as e:
            print(f"scale.py: {e}; logs were in {work}", file=sys.stderr)
            for log in sorted(work.rglob("*.log")):
                tail = log.read_text(errors="replace").splitlines()[-5:]
                print(f"--- {log.relative_to(work)}\n" + "\n".join(tail), file=sys.stderr)
            return 1
        finally:
            PROCS.stop_all()
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        PROCS.stop_all()
        sys.exit(130)
