#!/usr/bin/env python3
"""HTTP services benchmark (issue 15): Warren's HTTP port against frp's HTTP vhost and
against nginx alone, on one machine, everything on 127.0.0.1.

    http_bench.py run [--runs N] [--smoke] [--only a,b] [--duration S] [--write-results]
    http_bench.py render FILE.json [--write-results]

One nginx (a non-daemon process from a config in a temporary directory) serves two static
files of random bytes, /1k.bin (1 KiB) and /100k.bin (100 KiB). wrk loads it straight
(`direct`) or through a tunnel's HTTP front with `Host: web.bench.test`. Usually started by
`bench/run.sh --http`; see bench/README.md, section "HTTP services". Python 3 standard
library only; reuses bench.py's process handling (every process stopped by its PID).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as B  # noqa: E402  (bench.py: processes, ports, machine facts)

HERE = B.HERE
REPO = B.REPO
LOOPBACK = B.LOOPBACK
HOST = "web.bench.test"
SIZES = {"1k": 1024, "100k": 100 * 1024}

# Fixed order, interleaving Warren and frp, the same in every run. warren-http sits between
# the two configs it is compared with (capture off, the middleware chain), so drift over a run
# touches both comparisons alike.
ALL_CONFIGS = ["direct", "warren-http-nocapture", "warren-http", "warren-http-chain", "frp-vhost",
               "warren-http-tcp", "warren-tcp-service"]
SMOKE_CONFIGS = ["direct", "warren-http"]
LABELS = {
    "direct": "nginx direct (the limit)",
    "warren-http": "Warren HTTP, default transport (noise, cipher picked per machine); capture on, no middleware",
    "warren-http-nocapture": "Warren HTTP, default transport, `capture = false`",
    "warren-http-chain": "Warren HTTP, default transport, capture on, 5 middleware (ip_allow, rate_limit, headers, max_body, timeout)",
    "warren-http-tcp": "Warren HTTP, `transport = \"tcp\"` (plaintext)",
    "frp-vhost": "frp 0.71.0 HTTP vhost, default transport (TLS, tcpMux)",
    "warren-tcp-service": "Warren plain TCP service to nginx, default transport (no HTTP layer)",
}
# Load parameters (stated in the report).
WRK_THREADS, WRK_CONNS = 2, 32
NGINX_WORKERS = 1

SECTION = "## HTTP services (issue 15)"

# warren-http-chain: five built-in middleware that let every benchmark request through. The
# `headers` step sets a request header that nginx echoes back (`X-Seen`, see Nginx) and
# removes nginx's `Server` response header, so a check before the load sees it ran.
CHAIN_HEADER, CHAIN_VALUE = "X-Bench", "chain"
CHAIN_MIDDLEWARE = f"""
[[server.services.web.middleware]]
type = "ip_allow"
cidrs = ["127.0.0.0/8"]

[[server.services.web.middleware]]
type = "rate_limit"
rate = "1000000/s"
burst = 1000000

[[server.services.web.middleware]]
type = "headers"
request = {{ set = {{ "{CHAIN_HEADER}" = "{CHAIN_VALUE}" }} }}
response = {{ remove = ["Server"] }}

[[server.services.web.middleware]]
type = "max_body"
limit = "10MiB"

[[server.services.web.middleware]]
type = "timeout"
duration = "30s"
"""
CHAIN_KINDS = ["ip_allow", "rate_limit", "headers", "max_body", "timeout"]
# Warren HTTP configs that get an admin port, to check capture is on (or off) before the load.
ADMIN_CONFIGS = ("warren-http", "warren-http-nocapture", "warren-http-chain")

log = B.log
BenchError = B.BenchError


# ---------------------------------------------------------------- tools


def ensure_tools() -> None:
    """nginx, wrk and h2load (nghttp2-client) from Debian, installed only if missing
    (`apt-get update` first). A temporary policy-rc.d keeps the nginx package from
    starting its system service (which would listen on port 80 of every address)."""
    want = {"nginx": "nginx", "wrk": "wrk", "h2load": "nghttp2-client"}
    missing = [pkg for cmd, pkg in want.items() if not shutil.which(cmd)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise BenchError(f"missing {', '.join(missing)}: run as root or `apt-get install {' '.join(missing)}`")
    log(f"installing {' '.join(missing)} (Debian packages)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = False
    if not policy.exists():
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        made_policy = True
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        p = subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env,
                           capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            raise BenchError(f"apt-get install {' '.join(missing)} failed: {p.stderr[-500:]}")
    finally:
        if made_policy:
            policy.unlink(missing_ok=True)
    still = [cmd for cmd in want if not shutil.which(cmd)]
    if still:
        raise BenchError(f"still missing after apt-get: {', '.join(still)}")


# ---------------------------------------------------------------- nginx


class Nginx:
    """nginx in the foreground (`daemon off`), one worker, files in a temp dir."""

    def __init__(self, workdir: Path, www: Path) -> None:
        self.dir = workdir / "nginx"
        (self.dir / "tmp").mkdir(parents=True, exist_ok=True)
        self.port = B.free_port()
        tmp = self.dir / "tmp"
        # One process that serves (master_process off): stopped by its own PID, no workers
        # left behind; the same event loop as one worker.
        conf = f"""daemon off;
master_process off;
worker_processes {NGINX_WORKERS};
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    default_type application/octet-stream;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    server {{
        listen {LOOPBACK}:{self.port};
        server_name _;
        root {www};
        # Echoes the request header warren-http-chain's `headers` middleware sets; absent
        # (no header sent) when the request has none, i.e. in every other config.
        add_header X-Seen $http_x_bench;
    }}
}}
"""
        (self.dir / "nginx.conf").write_text(conf)
        self.proc = B.PROCS.start(["nginx", "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir),
                                   "-e", str(self.dir / "error.log")], self.dir / "stdout.log")
        B.wait_listening(self.port, proc=self.proc)

    def pids(self) -> list[int]:
        return [self.proc.pid]

    def stop(self) -> None:
        B.PROCS.stop(self.proc)


def make_www(workdir: Path) -> tuple[Path, dict[str, str]]:
    www = workdir / "www"
    www.mkdir()
    digests = {}
    for name, size in SIZES.items():
        data = os.urandom(size)
        (www / f"{name}.bin").write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    return www, digests


# ---------------------------------------------------------------- tunnels


class Front:
    """What wrk talks to: nginx itself (direct) or a tunnel's HTTP port."""

    def __init__(self, name: str, workdir: Path, bench_home: Path, warren: str) -> None:
        self.name = name
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bench_home = bench_home
        self.warren = warren
        self.server = self.client = None
        self.http_port = 0
        self.admin_port = 0

    def start(self, nginx_port: int) -> int:
        if self.name == "direct":
            self.http_port = nginx_port
        elif self.name.startswith("warren-"):
            self._warren(nginx_port)
        elif self.name == "frp-vhost":
            self._frp(nginx_port)
        else:
            raise BenchError(f"unknown config {self.name}")
        return self.http_port

    def _warren(self, nginx_port: int) -> None:
        port, self.http_port = B.free_port(), B.free_port()
        psk, token = secrets.token_hex(16), secrets.token_hex(16)
        common = f'psk = "{psk}"\ndefault_token = "{token}"\n'
        if self.name == "warren-http-tcp":
            common += 'transport = "tcp"\ninsecure = true\n'
        s = f'[server]\nbind = "{LOOPBACK}:{port}"\n{common}'
        c = f'[client]\nserver = "{LOOPBACK}:{port}"\n{common}reconnect_initial_delay = "100ms"\n'
        if self.name == "warren-tcp-service":
            # The same bytes through a plain TCP service: the tunnel without the HTTP layer.
            s += f'\n[server.services.web]\nbind = "{LOOPBACK}:{self.http_port}"\n'
            c += f'\n[client.services.web]\ntarget = "{LOOPBACK}:{nginx_port}"\n'
        else:
            s += (f'\n[server.http]\nbind = "{LOOPBACK}:{self.http_port}"\n'
                  f'\n[server.services.web]\ntype = "http"\nhosts = ["{HOST}"]\n')
            if self.name == "warren-http-nocapture":
                s += "capture = false\n"
            if self.name == "warren-http-chain":
                s += CHAIN_MIDDLEWARE
            if self.name in ADMIN_CONFIGS:
                self.admin_port = B.free_port()
                s += f'\n[admin]\nbind = "{LOOPBACK}:{self.admin_port}"\n'
            c += f'\n[client.services.web]\ntype = "http"\ntarget = "{LOOPBACK}:{nginx_port}"\n'
        (self.dir / "server.toml").write_text(s)
        (self.dir / "client.toml").write_text(c)
        self.client_config = self.dir / "client.toml"
        self.server = B.PROCS.start([self.warren, "--log-level", "warn", "server",
                                     str(self.dir / "server.toml")], self.dir / "server.log")
        B.wait_listening(port, proc=self.server)
        if self.name != "warren-tcp-service":  # a TCP service's port opens with the client
            B.wait_listening(self.http_port, proc=self.server)
        self.client = B.PROCS.start([self.warren, "--log-level", "warn", "client",
                                     str(self.dir / "client.toml")], self.dir / "client.log")

    def _frp(self, nginx_port: int) -> None:
        frps, frpc = B.tool("frps", self.bench_home), B.tool("frpc", self.bench_home)
        port, self.http_port = B.free_port(), B.free_port()
        token = secrets.token_hex(16)
        # frp's defaults otherwise: transport.tls.enable = true, transport.tcpMux = true.
        s = (f'bindAddr = "{LOOPBACK}"\nbindPort = {port}\nproxyBindAddr = "{LOOPBACK}"\n'
             f'vhostHTTPPort = {self.http_port}\nauth.token = "{token}"\nlog.level = "warn"\n')
        c = (f'serverAddr = "{LOOPBACK}"\nserverPort = {port}\nauth.token = "{token}"\n'
             f'loginFailExit = false\nlog.level = "warn"\n'
             f'\n[[proxies]]\nname = "web"\ntype = "http"\nlocalIP = "{LOOPBACK}"\n'
             f'localPort = {nginx_port}\ncustomDomains = ["{HOST}"]\n')
        (self.dir / "frps.toml").write_text(s)
        (self.dir / "frpc.toml").write_text(c)
        self.server = B.PROCS.start([frps, "-c", str(self.dir / "frps.toml")], self.dir / "server.log")
        B.wait_listening(port, proc=self.server)
        B.wait_listening(self.http_port, proc=self.server)
        self.client = B.PROCS.start([frpc, "-c", str(self.dir / "frpc.toml")], self.dir / "client.log")

    def pids(self) -> list[int]:
        return [p.pid for p in (self.server, self.client) if p is not None]

    def alive(self) -> bool:
        return all(p.poll() is None for p in (self.server, self.client) if p is not None)

    def stop(self) -> None:
        for p in (self.client, self.server):
            if p is not None:
                B.PROCS.stop(p)
        self.server = self.client = None

    def logs(self) -> str:
        out = []
        for f in sorted(self.dir.glob("*.log")):
            text = f.read_text(errors="replace")[-1500:]
            if text.strip():
                out.append(f"--- {f.name}\n{text}")
        return "\n".join(out)


# ---------------------------------------------------------------- figures


def get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Host": HOST})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def wait_serving(port: int, digests: dict[str, str], timeout: float = 20.0) -> float:
    """Until GET /1k.bin answers 200 through the front; then both files must come back
    whole (sha256). Returns the seconds it took."""
    t0 = time.monotonic()
    last = ""
    while time.monotonic() - t0 < timeout:
        try:
            status, body = get(port, "/1k.bin")
            if status == 200:
                break
            last = f"status {status}: {body[:120]!r}"
        except (OSError, http.client.HTTPException) as e:
            last = str(e)
        time.sleep(0.1)
    else:
        raise BenchError(f"no 200 from GET /1k.bin (Host: {HOST}) on port {port} within "
                         f"{timeout:.0f} s; last: {last}")
    ready = time.monotonic() - t0
    for name in SIZES:
        status, body = get(port, f"/{name}.bin", timeout=5)
        if status != 200 or hashlib.sha256(body).hexdigest() != digests[name]:
            raise BenchError(f"GET /{name}.bin: status {status}, {len(body)} bytes, "
                             "not the file nginx serves")
    return ready


def admin_json(port: int, path: str):
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=2)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise BenchError(f"admin GET {path}: status {resp.status}: {body[:200]!r}")
        try:
            return json.loads(body)
        except ValueError as e:
            raise BenchError(f"admin GET {path}: not JSON ({e}): {body[:200]!r}") from None
    finally:
        conn.close()


def check_config(name: str, port: int, admin_port: int) -> str:
    """Before the load, that a Warren HTTP config runs as named: the chain's `headers` step
    set the request header (nginx echoes it as X-Seen) and removed `Server` from the
    response, and not in the others; capture on keeps requests (the admin API lists them,
    with what the chain's middleware decided), capture off keeps none. Returns what it saw;
    raises BenchError when it is wrong."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=2)
    try:
        conn.request("GET", "/1k.bin", headers={"Host": HOST})
        resp = conn.getresponse()
        resp.read()
        status, seen, server = resp.status, resp.getheader("X-Seen"), resp.getheader("Server")
    finally:
        conn.close()
    if status != 200:
        raise BenchError(f"check: GET /1k.bin: status {status}")
    if name == "warren-http-chain":
        if seen != CHAIN_VALUE or server is not None:
            raise BenchError(f"check: the headers middleware did not run: nginx saw "
                             f"{CHAIN_HEADER}: {seen!r}, response Server: {server!r}")
        saw = [f"nginx saw {CHAIN_HEADER}: {seen}", "no Server header in the response"]
    else:
        if seen is not None or server is None:
            raise BenchError(f"check: X-Seen {seen!r}, Server {server!r}: expected none and nginx's")
        saw = [f"Server: {server} passed through"]
    capture = name != "warren-http-nocapture"
    items: list = []
    total = 0
    deadline = time.monotonic() + (3 if capture else 0.5)
    while time.monotonic() < deadline:  # captures are handed off through a queue
        items = admin_json(admin_port, "/api/v1/requests?service=web")  # newest first
        if not isinstance(items, list):
            raise BenchError(f"check: /api/v1/requests answered {str(items)[:200]}, not a list")
        total = len(items)
        if capture and total:
            break
        time.sleep(0.1)
    if capture != bool(total):
        raise BenchError(f"check: capture {'on' if capture else 'off'} but the inspector holds "
                         f"{total} requests of service web")
    saw.append(f"inspector holds {total} requests")
    if name == "warren-http-chain":
        rec = admin_json(admin_port, f"/api/v1/requests/{items[0]['id']}")
        decisions = ["=".join(d) if isinstance(d, list) else str(d) for d in rec.get("decisions", [])]
        sent = [v for k, v in rec.get("request_headers", []) if k.lower() == CHAIN_HEADER.lower()]
        saw.append(f"middleware decisions in the capture: {'; '.join(decisions) or 'none recorded'}")
        # Capture takes the request as it arrived, before the chain (replays go through it).
        saw.append(f"{CHAIN_HEADER} in the captured request headers (as the visitor sent them): "
                   f"{sent[0] if sent else 'absent'}")
    return ", ".join(saw)


_UNIT = {"us": 1.0, "ms": 1e3, "s": 1e6}


def parse_wrk(out: str) -> dict:
    res: dict = {}
    m = re.search(r"Requests/sec:\s*([\d.]+)", out)
    if m:
        res["rps"] = float(m.group(1))
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", out)
    if m:
        res["requests"] = int(m.group(1))
    for pct, val, unit in re.findall(r"^\s+(\d+)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M):
        res[f"p{pct}_us"] = float(val) * _UNIT[unit]
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out)
    res["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    res["socket_errors"] = sum(int(x) for x in m.groups()) if m else 0
    return res


def wrk(port: int, path: str, threads: int, conns: int, seconds: int,
        cpu_pids: list[int], nginx: Nginx) -> dict:
    argv = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds}s", "--latency",
            "-H", f"Host: {HOST}", f"http://{LOOPBACK}:{port}{path}"]
    npids = nginx.pids()
    t0 = sum(B.cpu_seconds(p) for p in cpu_pids)
    n0 = sum(B.cpu_seconds(p) for p in npids)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    t1 = sum(B.cpu_seconds(p) for p in cpu_pids)
    n1 = sum(B.cpu_seconds(p) for p in npids)
    res = parse_wrk(p.stdout)
    if p.returncode != 0 or "rps" not in res or not res.get("requests"):
        raise BenchError(f"wrk {' '.join(argv[1:])} failed (status {p.returncode}): "
                         f"{(p.stdout + p.stderr)[-600:]}")
    k = res["requests"] / 1000
    if cpu_pids:
        res["tunnel_cpu_ms_per_1k"] = (t1 - t0) * 1000 / k
    res["nginx_cpu_ms_per_1k"] = (n1 - n0) * 1000 / k
    return res


def measure(name: str, args, workdir: Path, warren: str, www: Path, digests: dict) -> dict:
    res: dict = {"errors": []}
    nginx = Nginx(workdir / name, www)
    front = Front(name, workdir, args.bench_home, warren)
    try:
        port = front.start(nginx.port)
        res["ready_s"] = round(wait_serving(port, digests), 3)
        if front.admin_port:
            try:
                res["check"] = check_config(name, port, front.admin_port)
            except (KeyError, IndexError, TypeError, AttributeError) as e:
                raise BenchError(f"check: unexpected admin API answer: {e!r}") from None
            log(f"  {name}: check ok: {res['check']}")
        if name in ("warren-http", "warren-tcp-service"):
            try:
                res.update(B.warren_choice(warren, front.client_config))
            except BenchError as e:
                res["errors"].append(f"warren ping: {e}")
        pids = front.pids()
        if args.warmup:
            wrk(port, "/1k.bin", WRK_THREADS, WRK_CONNS, args.warmup, pids, nginx)
        tests = [("1k", "/1k.bin", WRK_THREADS, WRK_CONNS),
                 ("100k", "/100k.bin", WRK_THREADS, WRK_CONNS),
                 ("c1", "/1k.bin", 1, 1)]
        for key, path, t, c in tests:
            try:
                if not front.alive():
                    raise BenchError("a tunnel process has exited")
                r = wrk(port, path, t, c, args.duration, pids, nginx)
                res.update({f"{key}_{k}": v for k, v in r.items()})
                if r["non2xx"] or r["socket_errors"]:
                    res["errors"].append(f"{key}: {r['non2xx']} non-2xx responses, "
                                         f"{r['socket_errors']} socket errors")
            except (BenchError, OSError, subprocess.SubprocessError) as e:
                res["errors"].append(f"{key}: {e}")
                log(f"{name}: {key} failed: {e}")
        if not front.alive():
            res["errors"].append("a tunnel process exited during the run")
        else:
            # The files must still come back whole after the load.
            try:
                wait_serving(port, digests, timeout=5)
            except (BenchError, OSError, http.client.HTTPException) as e:
                res["errors"].append(f"after the load: {e}")
    except (BenchError, OSError, subprocess.SubprocessError, http.client.HTTPException) as e:
        res["errors"].append(f"start: {e}")
        log(f"{name}: failed: {e}")
    finally:
        if res["errors"]:
            res["logs"] = (front.logs() + "\n" + nginx_log(nginx))[-3000:]
        front.stop()
        nginx.stop()
    return res


def nginx_log(nginx: Nginx) -> str:
    try:
        return "--- nginx error.log\n" + (nginx.dir / "error.log").read_text(errors="replace")[-800:]
    except OSError:
        return ""


# ---------------------------------------------------------------- machine


def machine() -> dict:
    m = B.machine_info()
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    m["cpu"] = model or m["cpu"]
    m["nproc"] = len(os.sched_getaffinity(0))
    m["aes"] = "aes" in flags
    m["avx512f"] = "avx512f" in flags
    return m


def versions(args, warren: str, configs: list[str]) -> dict:
    v = {
        "warren": (B.sh([warren, "--version"]).splitlines() or [""])[0].removeprefix("warren "),
        "warren commit": B.sh(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
        "nginx": B.sh(["sh", "-c", "nginx -v 2>&1"]).removeprefix("nginx version: nginx/"),
        "wrk": (B.sh(["sh", "-c", "wrk --version 2>&1"]).splitlines() or [""])[0].split(" [")[0].removeprefix("wrk "),
        "python": sys.version.split()[0],
    }
    if "frp-vhost" in configs:
        try:
            v["frp"] = B.sh([B.tool("frps", args.bench_home), "--version"])
        except BenchError:
            v["frp"] = "missing"
    return v


# ---------------------------------------------------------------- report


def med(doc: dict, cfg: str, key: str):
    vals = [r["configs"][cfg][key] for r in doc["runs"] if key in r["configs"].get(cfg, {})]
    return statistics.median(vals) if vals else None


def per_run(doc: dict, cfg: str, base: str, key: str, op) -> float | None:
    """Median over runs of op(cfg's key, base's key), each taken within one run."""
    vals = []
    for r in doc["runs"]:
        a, b = r["configs"].get(cfg, {}).get(key), r["configs"].get(base, {}).get(key)
        if a is not None and b:
            vals.append(op(a, b))
    return statistics.median(vals) if vals else None


def ratio(a, b):
    return a / b


def added(a, b):
    return a - b


def fmt(v, spec="{:.0f}") -> str:
    return "—" if v is None else spec.format(v)


COLUMNS = [
    ("1k_rps", "req/s 1 KiB", "{:.0f}"),
    ("100k_rps", "req/s 100 KiB", "{:.0f}"),
    ("1k_p50_us", "c=32 p50 µs (1 KiB)", "{:.0f}"),
    ("1k_p99_us", "c=32 p99 µs (1 KiB)", "{:.0f}"),
    ("c1_p50_us", "c=1 p50 µs", "{:.1f}"),
    ("c1_p99_us", "c=1 p99 µs", "{:.0f}"),
    ("c1_rps", "c=1 req/s", "{:.0f}"),
    ("1k_tunnel_cpu_ms_per_1k", "tunnel CPU ms / 1k req (1 KiB)", "{:.1f}"),
    ("100k_tunnel_cpu_ms_per_1k", "tunnel CPU ms / 1k req (100 KiB)", "{:.1f}"),
]


def targets(doc: dict) -> list[tuple[str, str, str, bool | None]]:
    out = []
    cfgs = set(doc["configs"])
    w = "warren-http"
    if w not in cfgs:
        return out
    if "frp-vhost" in cfgs:
        for key, what in (("1k_rps", "1 KiB"), ("100k_rps", "100 KiB")):
            r = per_run(doc, w, "frp-vhost", key, ratio)
            out.append((f"req/s {what} ≥ 1.5× frp-vhost", fmt(r, "{:.2f}×"), None if r is None else r >= 1.5))
    if "direct" in cfgs:
        for key, what in (("1k_rps", "1 KiB"), ("100k_rps", "100 KiB")):
            r = per_run(doc, w, "direct", key, ratio)
            out.append((f"req/s {what} ≥ 0.40× direct", fmt(r, "{:.2f}×"), None if r is None else r >= 0.40))
        a = per_run(doc, w, "direct", "c1_p50_us", added)
        out.append(("added p50 at c=1 ≤ 150 µs over direct", fmt(a, "{:.0f} µs"), None if a is None else a <= 150))
        a = per_run(doc, w, "direct", "c1_p99_us", added)
        out.append(("added p99 at c=1 ≤ 400 µs over direct", fmt(a, "{:.0f} µs"), None if a is None else a <= 400))
    # The HTTP layer's optional parts, against warren-http in the same run (1 KiB, c=32).
    if "warren-http-chain" in cfgs:
        r = per_run(doc, "warren-http-chain", w, "1k_rps", ratio)
        out.append(("5 built-in middleware cost ≤ 5 % of req/s 1 KiB (chain / warren-http ≥ 0.95×)",
                    cost(r), None if r is None else r >= 0.95))
    if "warren-http-nocapture" in cfgs:
        r = per_run(doc, w, "warren-http-nocapture", "1k_rps", ratio)
        out.append(("capture on (bodies off) costs ≤ 10 % of req/s 1 KiB (warren-http / nocapture ≥ 0.90×)",
                    cost(r), None if r is None else r >= 0.90))
    return out


def cost(r) -> str:
    """A ratio of req/s (with the feature / without) as the share of req/s the feature costs."""
    return "—" if r is None else f"{(1 - r) * 100:+.1f} % ({r:.3f}×)"


# The optional parts of the HTTP layer, each against what it is added to (within a run).
FEATURE_ROWS = [
    ("capture on (warren-http / warren-http-nocapture)", "warren-http", "warren-http-nocapture"),
    ("5 middleware (warren-http-chain / warren-http)", "warren-http-chain", "warren-http"),
]


def render(doc: dict, heading: str = "##") -> str:
    h = heading
    m = doc["machine"]
    s = doc["settings"]
    cfgs = [c for c in ALL_CONFIGS if c in doc["configs"]]
    loads = ", ".join(f"{r['loadavg_before']:.2f}" for r in doc["runs"])
    # Only the first run's load average says whether other processes were running: before
    # each later run it still holds this benchmark's own previous run (wrk, nginx and two
    # tunnel processes, decaying over about a minute). nginx alone's c=1 tail is the other
    # witness: on a quiet machine its p99 stays within a few times its p50.
    d50, d99 = med(doc, "direct", "c1_p50_us"), med(doc, "direct", "c1_p99_us")
    noisy = doc["runs"][0]["loadavg_before"] > 0.5 or bool(d50 and d99 and d99 > 10 * d50)
    lines = [
        f"{h} HTTP services (issue 15)",
        "",
        f"- Date: {doc['date']}" + (f" ({doc['seconds'] / 60:.0f} minutes)" if doc.get("seconds") else ""),
        f"- Machine: {m['cpu']}, nproc {m['nproc']}, {m['memory']}, Linux {m['kernel']}; "
        f"/proc/cpuinfo flags: aes {'yes' if m['aes'] else 'no'}, avx512f {'yes' if m['avx512f'] else 'no'}"
        + (f" (decisive features: {m['cpu_features']})" if m.get("cpu_features") else ""),
        f"- Runs: {len(doc['runs'])} (medians shown; ratios and differences are computed within "
        "each run, then the median taken); configs run in this order in every run, each with a "
        f"fresh nginx and fresh tunnel processes: {', '.join(cfgs)}",
        f"- Load: wrk `-t{s['wrk_threads']} -c{s['wrk_conns']} -d{s['duration']}s --latency` "
        f"(HTTP/1.1 keep-alive, `Host: {HOST}`) on /1k.bin and /100k.bin; latency at c=1: wrk "
        f"`-t1 -c1 -d{s['duration']}s --latency` on /1k.bin; {s['warmup']} s warm-up at c=32 first. "
        f"nginx: one process (`master_process off`, `daemon off`), `access_log off`, sendfile, keepalive_requests 10M. "
        "Tunnel CPU = utime + stime of the tunnel server + client over the wrk run, per 1000 requests.",
        f"- Versions: " + "; ".join(f"{k} {v}" for k, v in doc["versions"].items() if v),
        f"- 1-minute load average before each run: {loads} (after the first run it includes this "
        "benchmark's own previous run)"
        + (" — **noisy: other processes were running (load above 0.5 before the first run, or "
           "nginx alone's c=1 p99 above 10× its p50); rerun on a quiet machine for numbers to "
           "quote**" if noisy else ""),
        "",
        "| config | " + " | ".join(c[1] for c in COLUMNS) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for c in cfgs:
        lines.append(f"| {LABELS.get(c, c)} | " + " | ".join(fmt(med(doc, c, k), sp) for k, _, sp in COLUMNS) + " |")
    checks = {c: r["configs"][c]["check"] for r in doc["runs"][:1] for c in cfgs
              if "check" in r["configs"].get(c, {})}
    if checks:
        lines += ["", "Checked before each Warren HTTP config's load (run 1 shown; every run checks): "
                  "a `GET /1k.bin` through the front, nginx echoing the request header "
                  f"`{CHAIN_HEADER}` as `X-Seen`, and the inspector's `GET /api/v1/requests?service=web` "
                  "on an admin port:", ""]
        lines += [f"- `{c}`: {v}" for c, v in checks.items()]
    picked = sorted({r["configs"][c]["cipher"] for r in doc["runs"] for c in cfgs
                     if "cipher" in r["configs"].get(c, {})})
    if picked:
        lines += ["", f"Cipher Warren's default transport picked (`warren ping`): {', '.join(picked)}."]
    if "direct" in cfgs and len(cfgs) > 1:
        cols = [("req/s 1 KiB / direct", "1k_rps", "direct", ratio, "{:.2f}×"),
                ("req/s 100 KiB / direct", "100k_rps", "direct", ratio, "{:.2f}×")]
        if "frp-vhost" in cfgs:
            cols += [("req/s 1 KiB / frp-vhost", "1k_rps", "frp-vhost", ratio, "{:.2f}×"),
                     ("req/s 100 KiB / frp-vhost", "100k_rps", "frp-vhost", ratio, "{:.2f}×")]
        cols += [("added p50 at c=1 over direct", "c1_p50_us", "direct", added, "{:+.0f} µs"),
                 ("added p99 at c=1 over direct", "c1_p99_us", "direct", added, "{:+.0f} µs")]
        lines += ["", f"{h}# Ratios (within each run, median over runs)", "",
                  "| config | " + " | ".join(c[0] for c in cols) + " |", "|---|" + "---|" * len(cols)]
        for c in cfgs:
            if c == "direct":
                continue
            row = ["—" if c == base else fmt(per_run(doc, c, base, key, op), sp)
                   for _, key, base, op, sp in cols]
            lines.append(f"| {LABELS.get(c, c)} | " + " | ".join(row) + " |")
    feats = [(what, a, b) for what, a, b in FEATURE_ROWS if a in cfgs and b in cfgs]
    if feats:
        fcols = [("req/s 1 KiB", "1k_rps", ratio, cost), ("req/s 100 KiB", "100k_rps", ratio, cost),
                 ("c=32 p50 (1 KiB)", "1k_p50_us", added, lambda v: fmt(v, "{:+.0f} µs")),
                 ("c=1 p50", "c1_p50_us", added, lambda v: fmt(v, "{:+.1f} µs")),
                 ("c=1 req/s", "c1_rps", ratio, cost),
                 ("tunnel CPU / 1k req (1 KiB)", "1k_tunnel_cpu_ms_per_1k", added,
                  lambda v: fmt(v, "{:+.1f} ms"))]
        lines += ["", f"{h}# What capture and middleware cost (within each run, median over runs)", "",
                  "req/s columns: the share of req/s lost with the feature on (ratio in brackets); "
                  "the others: added by the feature.", "",
                  "| feature | " + " | ".join(c[0] for c in fcols) + " |", "|---|" + "---|" * len(fcols)]
        for what, a, b in feats:
            lines.append(f"| {what} | " + " | ".join(show(per_run(doc, a, b, key, op))
                                                     for _, key, op, show in fcols) + " |")
        lines += ["", "Per run (a few percent is within this machine's run-to-run noise):", "",
                  "- req/s 1 KiB: " + "; ".join(
            f"run {r['run']}: " + ", ".join(
                f"{c} {r['configs'][c]['1k_rps']:.0f}" for c in
                ("warren-http-nocapture", "warren-http", "warren-http-chain")
                if "1k_rps" in r["configs"].get(c, {}))
            for r in doc["runs"]) + "."]
        for what, a, b in feats:
            rs = [r["configs"][a]["1k_rps"] / r["configs"][b]["1k_rps"] for r in doc["runs"]
                  if r["configs"].get(a, {}).get("1k_rps") and r["configs"].get(b, {}).get("1k_rps")]
            if len(rs) > 1:
                lines.append(f"- ratio, {what}, req/s 1 KiB: "
                             + ", ".join(f"{x:.3f}×" for x in rs)
                             + f" (spread {min(rs):.3f}–{max(rs):.3f}×).")
    tg = targets(doc)
    if tg:
        lines += ["", f"{h}# Targets (Warren HTTP, default transport)", "",
                  "| target | measured | met? |", "|---|---|---|"]
        for what, measured, met in tg:
            lines.append(f"| {what} | {measured} | {'—' if met is None else ('met' if met else '**not met**')} |")
        p50, p99 = med(doc, "direct", "c1_p50_us"), med(doc, "direct", "c1_p99_us")
        if noisy and p50 and p99:
            lines += ["", f"This run was noisy: nginx alone (`direct`) had a c=1 p99 of {p99:.0f} µs "
                      f"against a p50 of {p50:.0f} µs, so the p99 figures here are the other "
                      "processes' scheduling on the two shared cores, not the tunnels'. Judge the p99 "
                      "target (and, less so, the others) only on a run from a quiet machine."]
    errs = [(r["run"], c, e) for r in doc["runs"] for c, v in r["configs"].items() for e in v.get("errors", [])]
    if errs:
        lines += ["", "Errors:", ""] + [f"- run {r}, {c}: {e}" for r, c, e in errs]
    lines += ["", "How it is measured: [README.md](README.md), section \"HTTP services\". "
              f"Raw data: `bench/results/{doc['json_name']}`."]
    return "\n".join(lines) + "\n"


def write_results(doc: dict) -> None:
    """Replaces (or appends) this section of bench/RESULTS.md. bench.py keeps every section
    from "## Scale" on when it rewrites the file, and this one is written after those."""
    B.replace_section(SECTION, render(doc, "##"))


# ---------------------------------------------------------------- main


def cmd_run(args) -> int:
    B.raise_nofile()
    ensure_tools()
    if args.smoke:
        configs = args.only or SMOKE_CONFIGS
        args.runs, args.duration, args.warmup = 1, min(args.duration, 2), 0
    else:
        configs = args.only or ALL_CONFIGS
    unknown = [c for c in configs if c not in ALL_CONFIGS]
    if unknown:
        log(f"unknown config(s) {', '.join(unknown)}; known: {', '.join(ALL_CONFIGS)}")
        return 2
    configs = [c for c in ALL_CONFIGS if c in configs]
    warren = args.warren or str(REPO / "target" / "release" / "warren")
    if any(c.startswith("warren") for c in configs) and not os.access(warren, os.X_OK):
        log(f"no warren binary at {warren}: run `cargo build --release` first")
        return 2
    now = dt.datetime.now(dt.timezone.utc)
    doc = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "json_name": "http-" + now.strftime("%Y%m%d-%H%M%S") + ".json",
        "machine": machine(),
        "versions": versions(args, warren, configs),
        "settings": {"duration": args.duration, "warmup": args.warmup, "wrk_threads": WRK_THREADS,
                     "wrk_conns": WRK_CONNS, "nginx_workers": NGINX_WORKERS, "smoke": args.smoke,
                     "host": HOST, "sizes": SIZES},
        "configs": configs,
        "runs": [],
    }
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="warren-http-bench-") as tmp:
        workdir = Path(tmp)
        www, digests = make_www(workdir)
        for run in range(1, args.runs + 1):
            rundir = workdir / f"run{run}"
            rundir.mkdir()
            entry = {"run": run, "loadavg_before": B.loadavg(), "configs": {}}
            log(f"run {run}/{args.runs} (load average {entry['loadavg_before']:.2f})")
            for cfg in configs:
                t0 = time.monotonic()
                res = measure(cfg, args, rundir, warren, www, digests)
                res["seconds"] = round(time.monotonic() - t0, 1)
                entry["configs"][cfg] = res
                log(f"  {cfg}: " + ", ".join(
                    f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in res.items() if k not in ("logs",) and (
                        k in ("errors", "ready_s") or k.endswith(("_rps", "p50_us", "p99_us", "cpu_ms_per_1k")))))
                time.sleep(0.5)
            doc["runs"].append(entry)
            if not args.smoke:
                save_json(doc)
    doc["seconds"] = round(time.monotonic() - started, 1)
    log(f"done in {doc['seconds']} s")

    if args.smoke:
        bad = []
        for cfg, r in doc["runs"][0]["configs"].items():
            ok = sum(r.get(f"{k}_requests", 0) - r.get(f"{k}_non2xx", 0) for k in ("1k", "100k", "c1"))
            if r["errors"] or ok <= 0:
                bad.append(f"{cfg}: {ok} 200s; {r['errors']}\n{r.get('logs', '')}")
        if bad:
            log("HTTP SMOKE FAILED: " + "\n".join(bad))
            return 1
        print(f"bench http smoke: ok in {doc['seconds']} s: " + "; ".join(
            f"{c} {r['1k_rps']:.0f} req/s (1 KiB), {r['100k_rps']:.0f} req/s (100 KiB), "
            f"c=1 p50 {r['c1_p50_us']:.0f} µs"
            for c, r in doc["runs"][0]["configs"].items()))
        return 0

    save_json(doc)
    if args.write_results:
        write_results(doc)
        log("wrote bench/RESULTS.md's section \"HTTP services (issue 15)\"")
    print(render(doc, "#"))
    return 1 if any(v["errors"] for r in doc["runs"] for v in r["configs"].values()) else 0


def save_json(doc: dict) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / doc["json_name"]).write_text(json.dumps(doc, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure")
    r.add_argument("--smoke", action="store_true",
                   help="~10 s: direct + warren-http, 1 run, 2 s loads, writes nothing; "
                   "exits non-zero if Warren's HTTP path returns no 200s")
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--only", type=lambda s: [x for x in s.split(",") if x], default=None,
                   help="comma-separated configs: " + ",".join(ALL_CONFIGS))
    r.add_argument("--duration", type=int, default=10, help="seconds per wrk load (default 10)")
    r.add_argument("--warmup", type=int, default=2, help="seconds of warm-up load per config (default 2)")
    r.add_argument("--warren", help="the warren binary (default target/release/warren)")
    r.add_argument("--bench-home", type=Path, default=Path(os.environ.get(
        "WARREN_BENCH_HOME", Path.home() / ".cache" / "warren-bench")))
    r.add_argument("--write-results", action="store_true",
                   help="write the section \"HTTP services (issue 15)\" of bench/RESULTS.md")
    d = sub.add_parser("render", help="print (and with --write-results, write) a saved run's tables")
    d.add_argument("json", type=Path)
    d.add_argument("--write-results", action="store_true")
    args = ap.parse_args()
    if args.cmd == "render":
        doc = json.loads(args.json.read_text())
        if args.write_results:
            write_results(doc)
        print(render(doc, "#"))
        return 0
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, B._on_signal)
    try:
        return cmd_run(args)
    except BenchError as e:
        log(f"error: {e}")
        return 1
    finally:
        B.PROCS.stop_all()


if __name__ == "__main__":
    sys.exit(main())
