#!/usr/bin/env python3
"""Side-by-side benchmark of Warren against rathole and frp on one machine.

Everything listens on 127.0.0.1 and every loop is bounded. Usually started by
bench/run.sh, which installs what is missing; see bench/README.md.

    bench.py run [--smoke] [--runs N] [--only a,b] [--iperf-time S] ...
    bench.py render RESULTS.json          # re-render RESULTS.md/README from raw JSON
    bench.py serve-echo PORT              # (internal) the local echo service
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import re
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
LOOPBACK = "127.0.0.1"

# Fixed order, interleaving Warren and the peers, the same in every run.
ALL_CONFIGS = [
    "raw",
    "rathole-tcp",
    "warren-default",
    "warren-aes128",
    "rathole-noise",
    "warren-aes256",
    "frp-plain",
    "warren-chacha20",
    "frp-tls",
    "warren-aegis128l",
    "warren-tcp",
    "warren-aegis256",
]
# Display order in the tables.
DISPLAY_ORDER = [
    "raw",
    "warren-default",
    "warren-aes128",
    "warren-aes256",
    "warren-chacha20",
    "warren-aegis128l",
    "warren-aegis256",
    "warren-tcp",
    "rathole-tcp",
    "rathole-noise",
    "frp-plain",
    "frp-tls",
]
LABELS = {
    "raw": "raw loopback (the limit)",
    "warren-default": "Warren noise, default config (cipher picked per machine)",
    "warren-aes128": "Warren noise aes-128-gcm",
    "warren-aes256": "Warren noise aes-256-gcm",
    "warren-chacha20": "Warren noise chacha20-poly1305",
    "warren-aegis128l": "Warren noise aegis-128l",
    "warren-aegis256": "Warren noise aegis-256",
    "warren-tcp": "Warren tcp (plaintext)",
    "rathole-tcp": "rathole 0.5.0 tcp",
    "rathole-noise": "rathole 0.5.0 noise (NK, ChaChaPoly)",
    "frp-plain": "frp 0.71.0 plain",
    "frp-tls": "frp 0.71.0 TLS (default)",
}
# None of these for `warren-tcp`; `DEFAULT_CIPHERS` writes no `ciphers` key at all, so the
# two sides pick by measured speed (`cipher_choice = "fastest"`, the default).
DEFAULT_CIPHERS = ""
WARREN_CIPHERS = {
    "warren-default": DEFAULT_CIPHERS,
    "warren-aes128": "aes-128-gcm",
    "warren-aes256": "aes-256-gcm",
    "warren-chacha20": "chacha20-poly1305",
    "warren-aegis128l": "aegis-128l",
    "warren-aegis256": "aegis-256",
}
SERVICES = ("iperf", "sockperf", "echo")


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


# ---------------------------------------------------------------- processes


class Procs:
    """Every process this script starts; each is stopped by its own PID."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], logfile: Path, env: dict | None = None) -> subprocess.Popen:
        out = open(logfile, "ab")
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        p = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, start_new_session=True,
        )
        out.close()
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen) -> None:
        if p.poll() is None:
            try:
                p.terminate()
                p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=3)
            except ProcessLookupError:
                pass
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self) -> None:
        for p in list(reversed(self.procs)):
            try:
                self.stop(p)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass


PROCS = Procs()


def _on_signal(signum, _frame):
    PROCS.stop_all()
    sys.exit(128 + signum)


_used_ports: set[int] = set()


def free_port() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind((LOOPBACK, 0))
            port = s.getsockname()[1]
        if port not in _used_ports:
            _used_ports.add(port)
            return port
    raise BenchError("no free loopback port")


def wait_listening(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise BenchError(f"nothing listens on {LOOPBACK}:{port} after {timeout:.0f} s")


def echo_once(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout) as s:
            s.sendall(b"r")
            return s.recv(1) == b"r"
    except OSError:
        return False


def wait_forwarding(port: int, timeout: float = 20.0) -> float:
    """Waits until a connect + 1-byte echo works through the tunnel; returns seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if echo_once(port):
            return time.monotonic() - t0
        time.sleep(0.1)
    raise BenchError(f"the tunnel did not forward port {port} within {timeout:.0f} s")


def vmrss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise BenchError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of stat (utime, stime) are 11 and 12 after the ")".
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def tool(name: str, bench_home: Path) -> str:
    cand = bench_home / "bin" / name
    if cand.exists():
        return str(cand)
    found = shutil.which(name)
    if not found:
        raise BenchError(f"{name} is not installed (bench/install-peers.sh installs it into {bench_home}/bin)")
    return found


# ---------------------------------------------------------------- local services


async def _echo_main(port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, LOOPBACK, port, backlog=4096)
    async with server:
        await server.serve_forever()


def serve_echo(port: int) -> None:
    raise_nofile()
    asyncio.run(_echo_main(port))


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class LocalServices:
    """iperf3 -s, sockperf sr and the echo service, started once per run."""

    def __init__(self, workdir: Path, with_sockperf: bool) -> None:
        self.ports = {name: free_port() for name in SERVICES}
        self.procs = [
            PROCS.start(["iperf3", "-s", "-B", LOOPBACK, "-p", str(self.ports["iperf"])],
                        workdir / "iperf3-server.log"),
            PROCS.start([sys.executable, str(Path(__file__).resolve()), "serve-echo",
                         str(self.ports["echo"])], workdir / "echo.log"),
        ]
        if with_sockperf:
            self.procs.append(PROCS.start(
                ["sockperf", "sr", "--tcp", "-i", LOOPBACK, "-p", str(self.ports["sockperf"])],
                workdir / "sockperf-server.log"))
        for name in ("iperf", "echo") + (("sockperf",) if with_sockperf else ()):
            wait_listening(self.ports[name])

    def stop(self) -> None:
        for p in self.procs:
            PROCS.stop(p)


# ---------------------------------------------------------------- tunnels


class Tunnel:
    """A server + client pair forwarding the local services; visitor ports on loopback."""

    name = ""

    def __init__(self, name: str, workdir: Path, bench_home: Path, warren: str) -> None:
        self.name = name
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bench_home = bench_home
        self.warren = warren
        self.server: subprocess.Popen | None = None
        self.client: subprocess.Popen | None = None

    def pids(self) -> list[int]:
        return [p.pid for p in (self.server, self.client) if p is not None]

    def alive(self) -> bool:
        return all(p.poll() is None for p in (self.server, self.client) if p is not None)

    def start(self, targets: dict[str, int]) -> dict[str, int]:
        raise NotImplementedError

    def stop(self) -> None:
        for p in (self.client, self.server):
            if p is not None:
                PROCS.stop(p)
        self.server = self.client = None

    def logs(self) -> str:
        out = []
        for f in sorted(self.dir.glob("*.log")):
            text = f.read_text(errors="replace")[-1500:]
            if text.strip():
                out.append(f"--- {f.name}\n{text}")
        return "\n".join(out)


class Raw(Tunnel):
    def start(self, targets):
        return dict(targets)


class Warren(Tunnel):
    def start(self, targets):
        cipher = WARREN_CIPHERS.get(self.name)
        server_port = free_port()
        visitors = {svc: free_port() for svc in targets}
        psk, token = secrets.token_hex(16), secrets.token_hex(16)
        common = f'psk = "{psk}"\ndefault_token = "{token}"\n'
        if cipher == DEFAULT_CIPHERS:
            common += 'transport = "noise"\n'
        elif cipher:
            common += f'transport = "noise"\nciphers = ["{cipher}"]\n'
        else:
            common += 'transport = "tcp"\ninsecure = true\n'
        s = f'[server]\nbind = "{LOOPBACK}:{server_port}"\n{common}'
        for svc, port in visitors.items():
            s += f'\n[server.services.{svc}]\nbind = "{LOOPBACK}:{port}"\n'
        if "iperf" in visitors:
            # UDP rides beside iperf3's TCP control connection on the same port number.
            s += f'\n[server.services.iperf-udp]\ntype = "udp"\nbind = "{LOOPBACK}:{visitors["iperf"]}"\n'
        c = (f'[client]\nserver = "{LOOPBACK}:{server_port}"\n{common}'
             'reconnect_initial_delay = "100ms"\n')
        for svc, port in targets.items():
            c += f'\n[client.services.{svc}]\ntarget = "{LOOPBACK}:{port}"\n'
        if "iperf" in targets:
            c += f'\n[client.services.iperf-udp]\ntype = "udp"\ntarget = "{LOOPBACK}:{targets["iperf"]}"\n'
        (self.dir / "server.toml").write_text(s)
        (self.dir / "client.toml").write_text(c)
        self.client_config = self.dir / "client.toml"
        self.server = PROCS.start([self.warren, "--log-level", "warn", "server",
                                   str(self.dir / "server.toml")], self.dir / "server.log")
        wait_listening(server_port)
        self.client = PROCS.start([self.warren, "--log-level", "warn", "client",
                                   str(self.dir / "client.toml")], self.dir / "client.log")
        return visitors


class Rathole(Tunnel):
    def start(self, targets):
        exe = tool("rathole", self.bench_home)
        noise = self.name == "rathole-noise"
        server_port = free_port()
        visitors = {svc: free_port() for svc in targets}
        s = f'[server]\nbind_addr = "{LOOPBACK}:{server_port}"\n'
        c = f'[client]\nremote_addr = "{LOOPBACK}:{server_port}"\n'
        if noise:
            out = subprocess.run([exe, "--genkey"], capture_output=True, text=True,
                                 timeout=10, check=True).stdout
            m = re.search(r"Private Key:\s*(\S+)\s+Public Key:\s*(\S+)", out)
            if not m:
                raise BenchError(f"cannot parse `rathole --genkey` output: {out!r}")
            s += ('\n[server.transport]\ntype = "noise"\n[server.transport.noise]\n'
                  f'local_private_key = "{m.group(1)}"\n')
            c += ('\n[client.transport]\ntype = "noise"\n[client.transport.noise]\n'
                  f'remote_public_key = "{m.group(2)}"\n')
        else:
            s += '\n[server.transport]\ntype = "tcp"\n'
            c += '\n[client.transport]\ntype = "tcp"\n'
        for svc in targets:
            token = secrets.token_hex(16)
            s += f'\n[server.services.{svc}]\ntoken = "{token}"\nbind_addr = "{LOOPBACK}:{visitors[svc]}"\n'
            c += f'\n[client.services.{svc}]\ntoken = "{token}"\nlocal_addr = "{LOOPBACK}:{targets[svc]}"\n'
        (self.dir / "server.toml").write_text(s)
        (self.dir / "client.toml").write_text(c)
        env = {"RUST_LOG": "warn"}
        self.server = PROCS.start([exe, "--server", str(self.dir / "server.toml")],
                                  self.dir / "server.log", env)
        wait_listening(server_port)
        self.client = PROCS.start([exe, "--client", str(self.dir / "client.toml")],
                                  self.dir / "client.log", env)
        return visitors


class Frp(Tunnel):
    def start(self, targets):
        frps, frpc = tool("frps", self.bench_home), tool("frpc", self.bench_home)
        tls = self.name == "frp-tls"
        server_port = free_port()
        visitors = {svc: free_port() for svc in targets}
        token = secrets.token_hex(16)
        s = (f'bindAddr = "{LOOPBACK}"\nbindPort = {server_port}\n'
             f'proxyBindAddr = "{LOOPBACK}"\nauth.token = "{token}"\nlog.level = "warn"\n')
        c = (f'serverAddr = "{LOOPBACK}"\nserverPort = {server_port}\nauth.token = "{token}"\n'
             f'loginFailExit = false\nlog.level = "warn"\n'
             f'transport.tls.enable = {"true" if tls else "false"}\n')
        for svc in targets:
            c += (f'\n[[proxies]]\nname = "{svc}"\ntype = "tcp"\nlocalIP = "{LOOPBACK}"\n'
                  f'localPort = {targets[svc]}\nremotePort = {visitors[svc]}\n')
        (self.dir / "frps.toml").write_text(s)
        (self.dir / "frpc.toml").write_text(c)
        self.server = PROCS.start([frps, "-c", str(self.dir / "frps.toml")], self.dir / "server.log")
        wait_listening(server_port)
        self.client = PROCS.start([frpc, "-c", str(self.dir / "frpc.toml")], self.dir / "client.log")
        return visitors


def make_tunnel(name: str, workdir: Path, bench_home: Path, warren: str) -> Tunnel:
    if name == "raw":
        cls = Raw
    elif name.startswith("warren-"):
        cls = Warren
    elif name.startswith("rathole-"):
        cls = Rathole
    elif name.startswith("frp-"):
        cls = Frp
    else:
        raise BenchError(f"unknown config {name}")
    return cls(name, workdir, bench_home, warren)


# ---------------------------------------------------------------- figures


def fig_idle_memory(t: Tunnel, port: int, n: int, settle: float) -> dict:
    """RSS of server + client with n idle connections held open, per connection.

    Each connection sends 1 byte and waits for its echo, so the whole path (visitor,
    data channel or stream, connection to the local service) is established; then
    nothing moves while RSS is read.
    """
    pids = t.pids()
    if not pids:
        return {}
    time.sleep(settle)
    idle = sum(vmrss_kb(p) for p in pids)
    socks = []
    failed = 0
    try:
        for _ in range(n):
            try:
                s = socket.create_connection((LOOPBACK, port), timeout=5)
                s.sendall(b"i")
                if s.recv(1) != b"i":
                    raise OSError("no echo")
                socks.append(s)
            except OSError:
                failed += 1
                if failed > n // 10:
                    raise BenchError(f"{failed} of the idle connections failed")
        time.sleep(settle)
        held = sum(vmrss_kb(p) for p in pids)
    finally:
        for s in socks:
            s.close()
    time.sleep(settle)
    return {
        "idle_conns": len(socks),
        "idle_failed": failed,
        "rss_idle_kb": idle,
        "rss_held_kb": held,
        "kb_per_idle_conn": (held - idle) / max(1, len(socks)),
    }


def fig_connect(port: int, n: int) -> dict:
    """n sequential connect + 1-byte echo + close; latency of connect + first byte."""
    for _ in range(20):  # warm-up
        echo_once(port)
    lat = []
    failed = 0
    t0 = time.perf_counter()
    for _ in range(n):
        a = time.perf_counter()
        try:
            with socket.create_connection((LOOPBACK, port), timeout=5) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.sendall(b"c")
                if s.recv(1) != b"c":
                    raise OSError("no echo")
                lat.append(time.perf_counter() - a)
        except OSError:
            failed += 1
            if failed > 20:
                raise BenchError(f"{failed} connects failed")
    elapsed = time.perf_counter() - t0
    lat.sort()
    return {
        "connects": len(lat),
        "connect_failed": failed,
        "connect_p50_us": statistics.median(lat) * 1e6,
        "connect_p99_us": lat[int(len(lat) * 0.99) - 1] * 1e6,
        "conn_per_s": len(lat) / elapsed,
    }


def fig_rtt(port: int, seconds: int) -> dict:
    argv = ["sockperf", "pp", "--tcp", "-i", LOOPBACK, "-p", str(port), "-m", "64",
            "--full-rtt", "-t", str(seconds)]
    last = ""
    for _ in range(3):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30)
        last = p.stdout + p.stderr
        pct = {m.group(1): float(m.group(2))
               for m in re.finditer(r"percentile\s+([\d.]+)\s*=\s*([\d.]+)", last)}
        if p.returncode == 0 and "50.000" in pct:
            return {"rtt_p50_us": pct["50.000"], "rtt_p99_us": pct["99.000"],
                    "rtt_p999_us": pct["99.900"]}
        time.sleep(1)
    raise BenchError(f"sockperf failed: {last[-500:]}")


def fig_iperf(t: Tunnel, port: int, seconds: int, extra: list[str]) -> dict:
    argv = ["iperf3", "-c", LOOPBACK, "-p", str(port), "-t", str(seconds), "-J"] + extra
    last = ""
    for _ in range(3):
        pids = t.pids()
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        p = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
        cpu1 = sum(cpu_seconds(pid) for pid in pids)
        last = p.stdout[-800:] + p.stderr[-400:]
        try:
            doc = json.loads(p.stdout)
        except ValueError:
            doc = {}
        recv = doc.get("end", {}).get("sum_received", {})
        if p.returncode == 0 and recv.get("bytes", 0) > 0:
            gb = recv["bytes"] / 1e9
            out = {"gbps": recv["bits_per_second"] / 1e9, "bytes": recv["bytes"]}
            if pids:
                out["cpu_s"] = cpu1 - cpu0
                out["cpu_s_per_gb"] = (cpu1 - cpu0) / gb
            return out
        time.sleep(1)
    raise BenchError(f"iperf3 {' '.join(extra) or '-P1'} failed: {last}")


def fig_udp(port: int, seconds: int) -> dict:
    """iperf3 -u -b 0 (as fast as the sender can go): receiver Gbit/s and loss."""
    argv = ["iperf3", "-c", LOOPBACK, "-p", str(port), "-u", "-b", "0", "-l", "1400",
            "-t", str(seconds), "-J"]
    last = ""
    for _ in range(3):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
        last = p.stdout[-800:] + p.stderr[-400:]
        try:
            end = json.loads(p.stdout).get("end", {})
        except ValueError:
            end = {}
        recv = end.get("sum_received") or end.get("sum") or {}
        if p.returncode == 0 and recv.get("bytes", 0) > 0:
            return {"udp_gbps": recv["bits_per_second"] / 1e9,
                    "udp_loss_pct": end.get("sum", recv).get("lost_percent", 0.0)}
        time.sleep(1)
    raise BenchError(f"iperf3 -u failed: {last}")


def warren_choice(warren: str, client_config: Path) -> dict:
    """The cipher a default config picks here, and both sides' figures: one `warren ping`
    probe with the client's config against the running server."""
    out = sh([warren, "ping", str(client_config), "-n", "1"])
    m = re.search(r"^cipher\s+(\S+) chosen by (.+)$", out, re.M)
    if not m:
        raise BenchError(f"warren ping did not say which cipher it chose: {out[-300:]!r}")
    return {"cipher": m.group(1), "cipher_choice": m.group(2)}


def measure_config(name: str, svc: LocalServices, args, workdir: Path, warren: str) -> dict:
    t = make_tunnel(name, workdir, args.bench_home, warren)
    res: dict = {"errors": []}
    try:
        visitors = t.start(svc.ports)
        res["ready_s"] = round(wait_forwarding(visitors["echo"]), 3)
        if name == "warren-default":
            res.update(warren_choice(warren, t.client_config))
        time.sleep(0.3)  # the other services registered together with echo; let them settle

        def step(label, fn):
            try:
                if not t.alive():
                    raise BenchError("a tunnel process has exited")
                res.update(fn())
            except (BenchError, OSError, subprocess.SubprocessError) as e:
                res["errors"].append(f"{label}: {e}")
                log(f"{name}: {label} failed: {e}")

        step("idle memory", lambda: fig_idle_memory(t, visitors["echo"], args.idle_conns,
                                                     0.5 if args.smoke else 2.0))
        step("connect", lambda: fig_connect(visitors["echo"], args.connects))
        if not args.no_sockperf:
            step("rtt", lambda: fig_rtt(visitors["sockperf"], args.sockperf_time))
        for key, extra in (("p1", []), ("p4", ["-P", "4"]), ("r", ["-R"])):
            if key in args.iperf_modes:
                step(f"iperf3 {key}", lambda extra=extra, key=key: {
                    f"{key}_{k}": v for k, v in fig_iperf(t, visitors["iperf"], args.iperf_time, extra).items()})
        if "udp" in args.iperf_modes and name.startswith(("raw", "warren")):
            step("iperf3 udp", lambda: fig_udp(visitors["iperf"], args.iperf_time))
        if not t.alive():
            res["errors"].append("a tunnel process exited during the run")
    except (BenchError, OSError, subprocess.SubprocessError) as e:
        res["errors"].append(f"start: {e}")
        log(f"{name}: failed to start: {e}")
    finally:
        if res["errors"]:
            res["logs"] = t.logs()[-3000:]
        t.stop()
    return res


# ---------------------------------------------------------------- machine


def sh(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info() -> dict:
    lscpu = sh(["lscpu"])
    model = re.search(r"Model name:\s*(.+)", lscpu)
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        mem = f"{kb / 1048576:.0f} GiB"
    except OSError:
        pass
    flags = re.search(r"Flags:\s*(.+)", lscpu)
    have = set(flags.group(1).split()) if flags else set()
    # The features that decide which cipher is fastest (see `warren doctor`); missing ones
    # are listed too, since "no avx512f" is what changes the default pick.
    decisive = ("aes", "vaes", "vpclmulqdq", "avx2", "avx512f")
    missing = [f for f in decisive if f not in have]
    return {
        "cpu_features": " ".join(f for f in decisive if f in have)
        + (f"; missing: {' '.join(missing)}" if missing and have else ""),
        "cpu": model.group(1).strip() if model else platform.processor(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "memory": mem,
    }


def versions(bench_home: Path, warren: str, configs: list[str]) -> dict:
    v = {
        "warren": (sh([warren, "--version"]).splitlines() or [""])[0].removeprefix("warren "),
        "warren commit": sh(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
        "iperf3": sh(["iperf3", "--version"]).splitlines()[0] if shutil.which("iperf3") else "",
        "python": platform.python_version(),
    }
    if shutil.which("sockperf"):
        out = subprocess.run(["sockperf", "--version"], capture_output=True, text=True).stdout
        m = re.search(r"version #?([\w.\-]+)", out)
        v["sockperf"] = m.group(1) if m else out.strip()[:40]
    for name, cmd in (("rathole", ["rathole", "--version"]), ("frp", ["frps", "--version"])):
        if any(c.startswith(name) for c in configs):
            try:
                out = sh([tool(cmd[0], bench_home)] + cmd[1:])
                m = re.search(r"Build Version:\s*(\S+)", out)  # rathole's --version
                v[name] = m.group(1) if m else out.splitlines()[0]
            except (BenchError, IndexError):
                v[name] = "missing"
    return v


def loadavg() -> float:
    return os.getloadavg()[0]


# ---------------------------------------------------------------- rendering

FIGS = [
    ("p1_gbps", "P1 Gbit/s", "{:.2f}"),
    ("p4_gbps", "P4 Gbit/s", "{:.2f}"),
    ("r_gbps", "-R Gbit/s", "{:.2f}"),
    ("rtt_p50_us", "RTT p50 µs", "{:.1f}"),
    ("rtt_p99_us", "p99 µs", "{:.0f}"),
    ("rtt_p999_us", "p99.9 µs", "{:.0f}"),
    ("kb_per_idle_conn", "KB / idle conn", "{:.1f}"),
    ("connect_p50_us", "connect p50 µs", "{:.0f}"),
    ("conn_per_s", "conn/s", "{:.0f}"),
    ("p1_cpu_s_per_gb", "CPU s/GB (P1)", "{:.2f}"),
]


def per_run_ratio(doc: dict, cfg: str, key: str, base: str) -> float | None:
    vals = []
    for run in doc["runs"]:
        a = run["configs"].get(cfg, {}).get(key)
        b = run["configs"].get(base, {}).get(key)
        if a is not None and b:
            vals.append(a / b)
    return statistics.median(vals) if vals else None


def med(doc: dict, cfg: str, key: str) -> float | None:
    vals = [run["configs"][cfg][key] for run in doc["runs"]
            if key in run["configs"].get(cfg, {})]
    return statistics.median(vals) if vals else None


def fmt(v, spec="{:.2f}") -> str:
    return "—" if v is None else spec.format(v)


def targets(doc: dict) -> list[tuple[str, str, str, bool | None]]:
    """(config, target, measured, met) from the issue's goals, ratios within each run."""
    out = []

    def ratio_target(cfg, key, base, factor, label, le=False):
        r = per_run_ratio(doc, cfg, key, base)
        met = None if r is None else (r <= factor if le else r >= factor)
        out.append((cfg, label, fmt(r, "{:.2f}×"), met))

    def abs_target(cfg, key, limit, label, unit):
        v = med(doc, cfg, key)
        out.append((cfg, label, fmt(v, "{:.1f} " + unit), None if v is None else v <= limit))

    for cfg in ("warren-aes128", "warren-aes256"):
        if cfg not in doc["configs"]:
            continue
        for key, fig in (("p1_gbps", "P1"), ("p4_gbps", "P4"), ("r_gbps", "-R")):
            ratio_target(cfg, key, "rathole-tcp", 1.0, f"{fig} ≥ rathole-tcp")
            ratio_target(cfg, key, "rathole-noise", 2.0, f"{fig} ≥ 2× rathole-noise")
        ratio_target(cfg, "rtt_p50_us", "rathole-tcp", 0.7, "RTT p50 ≤ 0.7× rathole-tcp", le=True)
        ratio_target(cfg, "rtt_p99_us", "rathole-tcp", 1.0, "RTT p99 ≤ rathole-tcp", le=True)
        abs_target(cfg, "kb_per_idle_conn", 16, "≤ 16 KB per idle connection", "KB")
        abs_target(cfg, "connect_p50_us", 250, "connect + first byte p50 ≤ 250 µs", "µs")
        ratio_target(cfg, "conn_per_s", "rathole-tcp", 2.0, "conn/s ≥ 2× rathole-tcp")
    if "warren-tcp" in doc["configs"]:
        ratio_target("warren-tcp", "p1_gbps", "rathole-tcp", 1.3, "P1 ≥ 1.3× rathole-tcp")
    if "warren-default" in doc["configs"]:
        # Issue 20: encryption with the default config within 15 % of plaintext.
        for key, fig in (("p1_gbps", "P1"), ("p4_gbps", "P4"), ("r_gbps", "-R")):
            if "warren-tcp" in doc["configs"]:
                ratio_target("warren-default", key, "warren-tcp", 0.85, f"{fig} ≥ 0.85× Warren plaintext")
            ratio_target("warren-default", key, "rathole-tcp", 1.6, f"{fig} ≥ 1.6× rathole-tcp")
        if "warren-tcp" in doc["configs"]:
            ratio_target("warren-default", "p1_cpu_s_per_gb", "warren-tcp", 1.25,
                         "CPU s/GB ≤ 1.25× Warren plaintext", le=True)
    if "warren-chacha20" in doc["configs"]:
        for key, fig in (("p1_gbps", "P1"), ("p4_gbps", "P4"), ("r_gbps", "-R")):
            ratio_target("warren-chacha20", key, "rathole-noise", 1.5, f"{fig} ≥ 1.5× rathole-noise")
    return out


def row_label(doc: dict, cfg: str) -> str:
    """The config's name, with the cipher(s) a default config picked in these runs."""
    picked = sorted({run["configs"][cfg]["cipher"] for run in doc["runs"]
                     if "cipher" in run["configs"].get(cfg, {})})
    return LABELS.get(cfg, cfg) + (f": {', '.join(picked)}" if picked else "")


def render(doc: dict, heading: str = "#") -> str:
    m = doc["machine"]
    cfgs = [c for c in DISPLAY_ORDER if c in doc["configs"]]
    n = len(doc["runs"])
    loads = ", ".join(f"{r['loadavg_before']:.2f}" for r in doc["runs"])
    noisy = any(r["loadavg_before"] > 0.5 for r in doc["runs"])
    lines = [
        f"{heading} Benchmark results",
        "",
        f"- Date: {doc['date']}" + (f" ({doc['seconds'] / 60:.0f} minutes)" if doc.get("seconds") else ""),
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}, Linux {m['kernel']}"
        + (f" (CPU features: {m['cpu_features']})" if m.get("cpu_features") else ""),
        f"- Runs: {n} (medians shown; ratios are computed within each run, then the median taken)",
        f"- iperf3 `-t {doc['settings']['iperf_time']}`; sockperf `-t {doc['settings']['sockperf_time']}`; "
        f"{doc['settings']['idle_conns']} idle connections; {doc['settings']['connects']} sequential connects",
        f"- Versions: " + "; ".join(f"{k} {v}" for k, v in doc["versions"].items() if v),
        f"- 1-minute load average before each run: {loads}"
        + ((" — **noisy: other processes were running (load above 0.5); differences under ±20% "
           "are noise; rerun on a quiet machine for numbers to quote**") if noisy else ""),
        "",
        "| config | " + " | ".join(h for _, h, _ in FIGS) + " |",
        "|---|" + "---|" * len(FIGS),
    ]
    for c in cfgs:
        row = [fmt(med(doc, c, k), spec) for k, _, spec in FIGS]
        lines.append(f"| {row_label(doc, c)} | " + " | ".join(row) + " |")
    choices = [(r["run"], c, r["configs"][c]["cipher_choice"]) for r in doc["runs"] for c in cfgs
               if "cipher_choice" in r["configs"].get(c, {})]
    if choices:
        lines += ["", "How the default config chose (seal/open GB/s on one core, measured by each "
                  "side at start-up):", ""]
        lines += [f"- run {run}, {LABELS.get(c, c)}: {how}" for run, c, how in choices]
    lines += [
        "",
        f"{heading}# Ratios (within each run, median over runs)",
        "",
        "| config | P1 / rathole-tcp | P4 / rathole-tcp | -R / rathole-tcp | P1 / raw | P4 / raw | -R / raw "
        "| RTT p50 / rathole-tcp | conn/s / rathole-tcp |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cfgs:
        if c == "raw":
            continue
        row = [fmt(per_run_ratio(doc, c, k, "rathole-tcp")) for k in ("p1_gbps", "p4_gbps", "r_gbps")]
        row += [fmt(per_run_ratio(doc, c, k, "raw")) for k in ("p1_gbps", "p4_gbps", "r_gbps")]
        row += [fmt(per_run_ratio(doc, c, k, "rathole-tcp")) for k in ("rtt_p50_us", "conn_per_s")]
        lines.append(f"| {LABELS.get(c, c)} | " + " | ".join(row) + " |")
    udp = [c for c in cfgs if med(doc, c, "udp_gbps") is not None]
    if udp:
        lines += ["", f"{heading}# UDP (iperf3 `-u -b 0 -l 1400`, receiver)", "",
                  "| config | Gbit/s | loss % |", "|---|---|---|"]
        for c in udp:
            lines.append(f"| {LABELS.get(c, c)} | {fmt(med(doc, c, 'udp_gbps'))} "
                         f"| {fmt(med(doc, c, 'udp_loss_pct'), '{:.1f}')} |")
    tg = targets(doc)
    if tg:
        lines += ["", f"{heading}# Targets from the issue", "",
                  "| config | target | measured | met? |", "|---|---|---|---|"]
        for cfg, label, measured, met in tg:
            mark = "—" if met is None else ("met" if met else "**not met**")
            lines.append(f"| {LABELS.get(cfg, cfg)} | {label} | {measured} | {mark} |")
    errs = [(r["run"], c, e) for r in doc["runs"] for c, v in r["configs"].items() for e in v.get("errors", [])]
    if errs:
        lines += ["", "Errors:", ""] + [f"- run {r}, {c}: {e}" for r, c, e in errs]
    lines += ["", "How each figure is measured: [bench/README.md](bench/README.md). "
              "Raw data: `bench/results/" + doc["json_name"] + "`."]
    return "\n".join(lines) + "\n"


def write_outputs(doc: dict) -> None:
    body = render(doc, "#").replace("](bench/README.md)", "](README.md)")
    # The "## Scale" section comes from bench/scale.py, not from this run: keep it.
    results = HERE / "RESULTS.md"
    old = results.read_text() if results.exists() else ""
    scale = old.find("\n## Scale")
    if scale >= 0:
        body += old[scale:]
    results.write_text(body)
    readme = REPO / "README.md"
    text = readme.read_text()
    idx = text.find("\n## Benchmarks")
    if idx < 0:
        raise BenchError("README.md has no ## Benchmarks section")
    section = render(doc, "##").split("\n", 1)[1]  # drop the "### Benchmark results" heading
    intro = (
        "\n## Benchmarks\n\n"
        "Warren against rathole and frp on one machine, everything on 127.0.0.1, measured by\n"
        "`bench/run.sh` ([bench/README.md](bench/README.md) says how and what each figure means;\n"
        "report and raw data: [bench/RESULTS.md](bench/RESULTS.md)). Compare rows within this\n"
        "table only, never with numbers from another run or machine. Record-layer\n"
        "micro-benchmarks: `cargo bench -p warren --bench record`.\n"
        "\n"
        "The fastest cipher depends on the CPU, so Warren picks it per machine by measured speed\n"
        "([Choosing the cipher](#choosing-the-cipher)): the `Warren noise, default config` row\n"
        "names the cipher it picked on the measuring machine, whose CPU features (and missing\n"
        "ones) are on the Machine line; the other Warren rows pin one cipher each.\n"
    )
    readme.write_text(text[:idx] + intro + section)


# ---------------------------------------------------------------- main


def cmd_run(args) -> int:
    raise_nofile()
    if args.smoke:
        configs = args.only or ["warren-aes128"]
        args.runs = 1
        args.iperf_time = min(args.iperf_time, 1)
        args.iperf_modes = ["p1"]
        args.sockperf_time = 1
        args.idle_conns = min(args.idle_conns, 50)
        args.connects = min(args.connects, 100)
        if not shutil.which("sockperf"):
            log("sockperf is missing: smoke mode skips the round-trip figure")
            args.no_sockperf = True
    else:
        configs = args.only or list(ALL_CONFIGS)
    configs = [c for c in ALL_CONFIGS if c in configs] + [c for c in configs if c not in ALL_CONFIGS]
    warren = args.warren or str(REPO / "target" / "release" / "warren")
    if not os.access(warren, os.X_OK):
        log(f"no warren binary at {warren}: run `cargo build --release` first")
        return 2
    if not shutil.which("iperf3") or (not args.no_sockperf and not shutil.which("sockperf")):
        log("iperf3 and sockperf are needed (bench/run.sh installs them)")
        return 2

    now = dt.datetime.now(dt.timezone.utc)
    doc = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "json_name": now.strftime("%Y%m%d-%H%M%S") + ".json",
        "machine": machine_info(),
        "versions": versions(args.bench_home, warren, configs),
        "settings": {
            "iperf_time": args.iperf_time, "sockperf_time": args.sockperf_time,
            "idle_conns": args.idle_conns, "connects": args.connects,
            "iperf_modes": args.iperf_modes, "smoke": args.smoke,
            "idle_connection_method": "connect, send 1 byte, read the 1-byte echo, then hold",
        },
        "configs": configs,
        "runs": [],
    }
    started = time.monotonic()
    failed = False
    with tempfile.TemporaryDirectory(prefix="warren-bench-") as tmp:
        workdir = Path(tmp)
        for run in range(1, args.runs + 1):
            rundir = workdir / f"run{run}"
            rundir.mkdir()
            entry = {"run": run, "loadavg_before": loadavg(), "configs": {}}
            log(f"run {run}/{args.runs} (load average {entry['loadavg_before']:.2f})")
            svc = LocalServices(rundir, not args.no_sockperf)
            try:
                for cfg in configs:
                    t0 = time.monotonic()
                    res = measure_config(cfg, svc, args, rundir, warren)
                    res["seconds"] = round(time.monotonic() - t0, 1)
                    entry["configs"][cfg] = res
                    failed |= bool(res["errors"])
                    log(f"  {cfg}: " + ", ".join(
                        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in res.items() if k not in ("errors", "logs")
                        and not k.endswith("bytes") and not k.endswith("_kb")))
                    time.sleep(0.5)
            finally:
                svc.stop()
            doc["runs"].append(entry)
            if not args.smoke:
                save_json(doc, args)  # keep what was measured even if a later run dies
    doc["seconds"] = round(time.monotonic() - started, 1)
    log(f"done in {doc['seconds']} s")

    if args.smoke:
        res = doc["runs"][0]["configs"]
        for cfg, r in res.items():
            if r.get("p1_bytes", 0) <= 0:
                log(f"SMOKE FAILED: {cfg} carried no bytes: {r.get('errors')}\n{r.get('logs', '')}")
                return 1
            if r["errors"]:
                log(f"SMOKE FAILED: {cfg}: {r['errors']}\n{r.get('logs', '')}")
                return 1
        print(f"bench smoke: ok in {doc['seconds']} s: " + "; ".join(
            f"{c} P1 {r['p1_gbps']:.2f} Gbit/s, RTT p50 {r.get('rtt_p50_us', float('nan')):.0f} µs, "
            f"connect p50 {r['connect_p50_us']:.0f} µs, {r['kb_per_idle_conn']:.1f} KB/idle conn"
            for c, r in res.items()))
        return 0

    save_json(doc, args)
    if args.write_results:
        write_outputs(doc)
        log("wrote bench/RESULTS.md and the README Benchmarks section")
    print(render(doc, "#"))
    return 1 if failed else 0


def save_json(doc: dict, args) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / doc["json_name"]).write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure")
    r.add_argument("--smoke", action="store_true", help="a few seconds, Warren only, no files written")
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--only", type=lambda s: [x for x in s.split(",") if x], default=None,
                   help="comma-separated configs: " + ",".join(ALL_CONFIGS))
    r.add_argument("--iperf-time", type=int, default=5)
    r.add_argument("--iperf-modes", type=lambda s: s.split(","), default=["p1", "p4", "r", "udp"])
    r.add_argument("--sockperf-time", type=int, default=4)
    r.add_argument("--idle-conns", type=int, default=1000)
    r.add_argument("--connects", type=int, default=2000)
    r.add_argument("--no-sockperf", action="store_true")
    r.add_argument("--warren", help="the warren binary (default target/release/warren)")
    r.add_argument("--bench-home", type=Path, default=Path(os.environ.get(
        "WARREN_BENCH_HOME", Path.home() / ".cache" / "warren-bench")))
    r.add_argument("--write-results", action="store_true",
                   help="write bench/RESULTS.md and README.md's Benchmarks section")
    e = sub.add_parser("serve-echo")
    e.add_argument("port", type=int)
    d = sub.add_parser("render", help="print (and with --write-results, write) the tables of a JSON file")
    d.add_argument("json", type=Path)
    d.add_argument("--write-results", action="store_true")
    args = ap.parse_args()

    if args.cmd == "serve-echo":
        serve_echo(args.port)
        return 0
    if args.cmd == "render":
        doc = json.loads(args.json.read_text())
        if args.write_results:
            write_outputs(doc)
        print(render(doc, "#"))
        return 0
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    try:
        return cmd_run(args)
    except BenchError as e:
        log(f"error: {e}")
        return 1
    finally:
        PROCS.stop_all()


if __name__ == "__main__":
    sys.exit(main())
