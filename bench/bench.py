#!/usr/bin/env python3
"""Side-by-side benchmark of Warren against rathole and frp on one machine.

Everything listens on 127.0.0.1 (or, with --netns, inside two network namespaces this
script creates) and every loop is bounded. Usually started by bench/run.sh, which
installs what is missing; see bench/README.md.

    bench.py run [--smoke] [--runs N] [--only a,b] [--iperf-time S] ...
    bench.py run --netns [--mtu 1500] ...  # server and client in two namespaces, one veth
    bench.py render RESULTS.json          # re-render RESULTS.md/README from raw JSON
    bench.py serve-echo PORT [HOST]       # (internal) the local echo service
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
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
    "warren-baseline",  # only with --baseline-warren
    "warren-lz4",
    "warren-aes128",
    "rathole-noise",
    "warren-quic",
    "frp-quic",
    "warren-aes256",
    "frp-plain",
    "warren-chacha20",
    "frp-tls",
    "warren-tls",
    "frp-wss",
    "warren-wss",
    "warren-quic-loopback",
    "warren-aegis128l",
    "warren-quic-1w",
    "warren-tcp",
    "warren-aegis256",
    "warren-p2p",
    "warren-p2p-relayed",
    "warren-quic-cubic",  # only with --only: quinn's controllers, for comparison
    "warren-quic-bbr",
]
# What `run` measures without --only (warren-baseline needs --baseline-warren).
DEFAULT_CONFIGS = [c for c in ALL_CONFIGS
                   if c not in ("warren-baseline", "warren-quic-cubic", "warren-quic-bbr")]
# What `run --netns` measures without --only: the path is a 1500-byte veth, so
# warren-quic-loopback (packets larger than that MTU) does not belong there.
NETNS_CONFIGS = ["raw", "warren-default", "warren-quic", "frp-quic", "warren-tcp"]
# Display order in the tables.
DISPLAY_ORDER = [
    "raw",
    "warren-default",
    "warren-baseline",
    "warren-lz4",
    "warren-aes128",
    "warren-aes256",
    "warren-chacha20",
    "warren-aegis128l",
    "warren-aegis256",
    "warren-tcp",
    "warren-tls",
    "warren-wss",
    "warren-quic",
    "warren-quic-loopback",
    "warren-quic-1w",
    "warren-p2p",
    "warren-p2p-relayed",
    "rathole-tcp",
    "rathole-noise",
    "frp-plain",
    "frp-tls",
    "frp-wss",
    "frp-quic",
]
LABELS = {
    "raw": "raw loopback (the limit)",
    "warren-default": "Warren noise, default config (cipher picked per machine)",
    "warren-baseline": "Warren before (--baseline-warren), default config",
    "warren-lz4": "Warren noise, default config, compression = \"lz4\" both sides (iperf3's random payload)",
    "warren-aes128": "Warren noise aes-128-gcm",
    "warren-aes256": "Warren noise aes-256-gcm",
    "warren-chacha20": "Warren noise chacha20-poly1305",
    "warren-aegis128l": "Warren noise aegis-128l",
    "warren-aegis256": "Warren noise aegis-256",
    "warren-tcp": "Warren tcp (plaintext)",
    "warren-tls": "Warren tls (TLS 1.3 on TCP, PSK bound inside)",
    "warren-wss": "Warren wss (WebSocket on TLS; straight to the server, so TLS alone encrypts)",
    "warren-quic": "Warren quic, 1452-byte packets",
    "warren-quic-loopback": "Warren quic, loopback packets",
    "warren-quic-1w": "Warren quic, 1452-byte packets, one worker thread per process (`--workers 1` both sides)",
    "warren-quic-cubic": "Warren quic, 1452-byte packets, quinn's cubic (`congestion = \"cubic\"`)",
    "warren-quic-bbr": "Warren quic, 1452-byte packets, quinn's bbr (`congestion = \"bbr\"`)",
    "warren-p2p": "Warren p2p tunnel, direct (no server hop)",
    "warren-p2p-relayed": "Warren p2p tunnel, through the server's relay",
    "rathole-tcp": "rathole 0.5.0 tcp",
    "rathole-noise": "rathole 0.5.0 noise (NK, ChaChaPoly)",
    "frp-plain": "frp 0.71.0 plain",
    "frp-tls": "frp 0.71.0 TLS (default)",
    "frp-wss": "frp 0.71.0 wss (WebSocket on TLS; nginx terminates the TLS, frps takes no TLS WebSocket itself)",
    "frp-quic": "frp 0.71.0 QUIC",
}
NETNS_LABELS = {"raw": "raw, across the veth (the limit)"}
# None of these for `warren-tcp`; `DEFAULT_CIPHERS` writes no `ciphers` key at all, so the
# two sides pick by measured speed (`cipher_choice = "fastest"`, the default).
DEFAULT_CIPHERS = ""
WARREN_CIPHERS = {
    "warren-default": DEFAULT_CIPHERS,
    "warren-baseline": DEFAULT_CIPHERS,
    "warren-lz4": DEFAULT_CIPHERS,
    "warren-aes128": "aes-128-gcm",
    "warren-aes256": "aes-256-gcm",
    "warren-chacha20": "chacha20-poly1305",
    "warren-aegis128l": "aegis-128l",
    "warren-aegis256": "aegis-256",
}
# `compression` on both sides' tcp services: iperf3 sends random bytes, so this row is
# what compression costs on data that does not compress (issue 19: at most 5 %).
WARREN_COMPRESSION = {"warren-lz4": "lz4"}
# The web-looking transports (issue 19): the server's self-signed certificate is made in the
# run's directory; `wss` keeps the default cipher choice inside.
WARREN_TRANSPORT = {"warren-tls": "tls", "warren-wss": "wss"}
# The largest UDP payload warren-quic-loopback lets QUIC send (`[server.quic] max_packet`
# and `[client.quic] max_packet`); warren-quic keeps Warren's default (1452, as on the
# internet). Loopback's MTU is 65536, but see shared/FACTS.md: above ~6.5 KB with GSO,
# batches exceed 64 KB; tune this with the transport.
QUIC_LOOPBACK_PACKET = 65527
WARREN_QUIC_PACKET = {"warren-quic": None, "warren-quic-loopback": QUIC_LOOPBACK_PACKET,
                      "warren-quic-1w": None, "warren-quic-cubic": None, "warren-quic-bbr": None}
# QUIC rows with one of quinn's controllers instead of Warren's default (`model`), both
# sides' `[*.quic] congestion` (bench/wan.py compares them across the WAN lab).
WARREN_QUIC_CONGESTION = {"warren-quic-cubic": "cubic", "warren-quic-bbr": "bbr"}
# Configs whose server and client run with `--workers N` (the async runtime's threads)
# instead of the default, one per core: with one, every hop between quinn's endpoint and
# connection tasks and the stream tasks stays on one thread.
WARREN_WORKERS = {"warren-quic-1w": 1}
# The network namespace mode: documentation addresses (RFC 5737) on the veth pair.
NETNS_SERVER_ADDR = "198.51.100.1"
NETNS_CLIENT_ADDR = "198.51.100.2"
SERVICES = ("iperf", "sockperf", "echo")


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


class Unavailable(Exception):
    """The config needs something this Warren binary does not have (e.g. the QUIC
    transport): reported as "not available with this binary", not as a failure."""


class Net:
    """Where the tunnel and the local services live.

    Loopback by default: everything on 127.0.0.1 in this namespace. With --netns the
    harness (visitors) and the tunnel server are in one namespace, the tunnel client and
    the local services in another, joined by a veth pair: the tunnel crosses a real
    1500-byte path. Visitors always connect to 127.0.0.1 in the harness's namespace.
    """

    def __init__(self) -> None:
        self.tunnel_host = LOOPBACK  # the tunnel server binds here; the client dials it
        self.target_host = LOOPBACK  # iperf3 -s, sockperf sr and the echo service
        self.client_prefix: list[str] = []  # runs a command in the client's namespace
        self.netns: "NetnsPair | None" = None


NET = Net()


# ---------------------------------------------------------------- processes


def _die_with_parent():
    """preexec_fn: the child gets SIGTERM if this script dies, even by SIGKILL (which no
    handler sees), so no server, client or service outlives the harness."""
    if _prctl is not None:
        _prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


try:
    import ctypes
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


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
            env=full_env, start_new_session=True, preexec_fn=_die_with_parent,
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


def free_port(udp: bool = False) -> int:
    """A loopback port free for TCP (and, with udp, for UDP too: QUIC servers)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((LOOPBACK, 0))
            port = s.getsockname()[1]
        if port in _used_ports:
            continue
        if udp:
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                    u.bind((LOOPBACK, port))
            except OSError:
                continue
        _used_ports.add(port)
        return port
    raise BenchError("no free loopback port")


def _exited(proc: subprocess.Popen | None) -> bool:
    return proc is not None and proc.poll() is not None


def wait_listening(port: int, timeout: float = 10.0, host: str = LOOPBACK,
                   proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if _exited(proc):
                raise BenchError(f"the process that should listen on {host}:{port} exited "
                                 f"(status {proc.returncode})")
            time.sleep(0.05)
    raise BenchError(f"nothing listens on {host}:{port} after {timeout:.0f} s")


def udp_bound(port: int) -> bool:
    """Whether a UDP socket is bound to this port in this network namespace."""
    suffix = f":{port:04X}"
    for path in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(path) as f:
                next(f, None)
                if any(line.split()[1].endswith(suffix) for line in f if line.strip()):
                    return True
        except OSError:
            pass
    return False


def wait_udp_bound(port: int, timeout: float = 10.0,
                   proc: subprocess.Popen | None = None) -> None:
    """A QUIC server listens on UDP, which a TCP connect cannot see: wait until its socket
    is bound (from /proc/net/udp); wait_forwarding then proves the tunnel works."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if udp_bound(port):
            return
        if _exited(proc):
            raise BenchError(f"the process that should bind UDP port {port} exited "
                             f"(status {proc.returncode})")
        time.sleep(0.05)
    raise BenchError(f"nothing bound UDP port {port} after {timeout:.0f} s")


def echo_once(port: int, timeout: float = 1.0, host: str = LOOPBACK) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"r")
            return s.recv(1) == b"r"
    except OSError:
        return False


def wait_forwarding(port: int, timeout: float = 20.0, host: str = LOOPBACK) -> float:
    """Waits until a connect + 1-byte echo works through the tunnel; returns seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if echo_once(port, host=host):
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


# ---------------------------------------------------------------- network namespaces

CLONE_NEWNET = 0x40000000
NETNS_PREFIX = "warren-bench-"


def _setns(fd: int) -> None:
    """Moves this thread (the only one that starts processes and opens sockets) into the
    network namespace behind fd; children started afterwards inherit it."""
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, CLONE_NEWNET)
        return
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _netns_path(name: str) -> str:
    for d in ("/run/netns", "/var/run/netns"):
        if os.path.exists(f"{d}/{name}"):
            return f"{d}/{name}"
    raise BenchError(f"network namespace {name} was created but {name} is not under /run/netns")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class NetnsPair:
    """Two network namespaces joined by a veth pair; this process enters the server's.

    Names are unique (this PID and random hex): warren-bench-PID-HEX-server/-client, veth
    wbsHEX/wbcHEX. close() (also on error, Ctrl-C, SIGTERM and at exit) goes back to the
    original namespace and deletes both namespaces, which deletes the veth pair with them.
    Namespaces a killed (SIGKILL) earlier run left behind are deleted at the next start:
    their PID no longer exists.
    """

    def __init__(self, mtu: int) -> None:
        if os.geteuid() != 0:
            raise BenchError("--netns needs root: it creates two network namespaces and a veth pair "
                             "(run as root, e.g. `sudo bench/run.sh --netns`)")
        if not shutil.which("ip"):
            raise BenchError("--netns needs `ip` (Debian package iproute2)")
        self.mtu = mtu
        self._orig: int | None = None
        self._created: list[str] = []
        self._veth_in_root = False
        self._remove_stale()
        tag = secrets.token_hex(3)
        self.server_ns = f"{NETNS_PREFIX}{os.getpid()}-{tag}-server"
        self.client_ns = f"{NETNS_PREFIX}{os.getpid()}-{tag}-client"
        self.veth_server, self.veth_client = f"wbs{tag}", f"wbc{tag}"  # <= 15 characters
        atexit.register(self.close)
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _ip(*args: str, check: bool = True) -> str:
        p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
        if check and p.returncode != 0:
            raise BenchError(f"`ip {' '.join(args)}` failed: {p.stderr.strip()}")
        return p.stdout

    def _remove_stale(self) -> None:
        for line in self._ip("netns", "list", check=False).splitlines():
            name = line.split()[0] if line.split() else ""
            m = re.fullmatch(re.escape(NETNS_PREFIX) + r"(\d+)-[0-9a-f]+-(server|client)", name)
            if m and not _pid_alive(int(m.group(1))):
                log(f"deleting network namespace {name} left by an earlier run (PID {m.group(1)} is gone)")
                self._ip("netns", "del", name, check=False)

    def _setup(self) -> None:
        for ns in (self.server_ns, self.client_ns):
            self._ip("netns", "add", ns)
            self._created.append(ns)
        self._ip("link", "add", self.veth_server, "type", "veth", "peer", "name", self.veth_client)
        self._veth_in_root = True
        self._ip("link", "set", self.veth_server, "netns", self.server_ns)
        self._ip("link", "set", self.veth_client, "netns", self.client_ns)
        self._veth_in_root = False
        for ns, dev, addr in ((self.server_ns, self.veth_server, NETNS_SERVER_ADDR),
                              (self.client_ns, self.veth_client, NETNS_CLIENT_ADDR)):
            self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            self._ip("-n", ns, "link", "set", dev, "mtu", str(self.mtu), "up")
        got = self._ip("-n", self.server_ns, "link", "show", self.veth_server)
        if f"mtu {self.mtu} " not in got:
            raise BenchError(f"the veth did not take MTU {self.mtu}: {got.strip()}")
        self._orig = os.open("/proc/self/ns/net", os.O_RDONLY)
        fd = os.open(_netns_path(self.server_ns), os.O_RDONLY)
        try:
            _setns(fd)
        finally:
            os.close(fd)
        log(f"network namespaces {self.server_ns} ({NETNS_SERVER_ADDR}) and {self.client_ns} "
            f"({NETNS_CLIENT_ADDR}), veth MTU {self.mtu}")

    def client_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.client_ns]

    def close(self) -> None:
        if self._orig is not None:
            try:
                _setns(self._orig)
            except OSError as e:
                log(f"could not go back to the original network namespace: {e}")
            os.close(self._orig)
            self._orig = None
        if self._veth_in_root:
            self._ip("link", "del", self.veth_server, check=False)
            self._veth_in_root = False
        while self._created:
            ns = self._created.pop()
            try:
                self._ip("netns", "del", ns)
            except (BenchError, OSError, subprocess.SubprocessError) as e:
                log(f"could not delete network namespace {ns}: {e} (`ip netns del {ns}`)")


# ---------------------------------------------------------------- local services


async def _echo_main(port: int, host: str = LOOPBACK) -> None:
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

    server = await asyncio.start_server(handle, host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def serve_echo(port: int, host: str = LOOPBACK) -> None:
    raise_nofile()
    asyncio.run(_echo_main(port, host))


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class LocalServices:
    """iperf3 -s, sockperf sr and the echo service, started once per run (on loopback, or
    with --netns in the client's namespace, on its veth address)."""

    def __init__(self, workdir: Path, with_sockperf: bool) -> None:
        self.ports = {name: free_port() for name in SERVICES}
        host, pre = NET.target_host, NET.client_prefix
        self.procs = [
            PROCS.start(pre + ["iperf3", "-s", "-B", host, "-p", str(self.ports["iperf"])],
                        workdir / "iperf3-server.log"),
            PROCS.start(pre + [sys.executable, str(Path(__file__).resolve()), "serve-echo",
                               str(self.ports["echo"])] + ([host] if host != LOOPBACK else []),
                        workdir / "echo.log"),
        ]
        if with_sockperf:
            self.procs.append(PROCS.start(
                pre + ["sockperf", "sr", "--tcp", "-i", host, "-p", str(self.ports["sockperf"])],
                workdir / "sockperf-server.log"))
        for name in ("iperf", "echo") + (("sockperf",) if with_sockperf else ()):
            wait_listening(self.ports[name], host=host)

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
        self.visit_host = LOOPBACK  # where the visitors (iperf3 -c, sockperf pp, ...) connect

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
        self.visit_host = NET.target_host
        return dict(targets)


class Warren(Tunnel):
    def start(self, targets):
        cipher = WARREN_CIPHERS.get(self.name)
        quic = self.name in WARREN_QUIC_PACKET
        packet = WARREN_QUIC_PACKET.get(self.name)
        host, target_host = NET.tunnel_host, NET.target_host
        server_port = free_port(udp=quic)
        visitors = {svc: free_port() for svc in targets}
        psk, token = secrets.token_hex(16), secrets.token_hex(16)
        common = f'psk = "{psk}"\ndefault_token = "{token}"\n'
        web = WARREN_TRANSPORT.get(self.name)
        if web:
            common += f'transport = "{web}"\n'
        elif quic:
            common += 'transport = "quic"\n'
        elif cipher == DEFAULT_CIPHERS:
            common += 'transport = "noise"\n'
        elif cipher:
            common += f'transport = "noise"\nciphers = ["{cipher}"]\n'
        else:
            common += 'transport = "tcp"\ninsecure = true\n'
        s = f'[server]\nbind = "{host}:{server_port}"\n{common}'
        if quic:
            # The server makes this self-signed certificate on its first start.
            s += f'\n[server.quic]\ncert = "{self.dir / "quic-cert.pem"}"\n'
            if packet:
                s += f"max_packet = {packet}\n"
        congestion = WARREN_QUIC_CONGESTION.get(self.name)
        if congestion:
            s += f'congestion = "{congestion}"\n'
        if web:
            s += f'\n[server.tls]\ncert = "{self.dir / "tls-cert.pem"}"\n'
        compression = WARREN_COMPRESSION.get(self.name)
        compress = f'compression = "{compression}"\n' if compression else ""
        for svc, port in visitors.items():
            s += f'\n[server.services.{svc}]\nbind = "{LOOPBACK}:{port}"\n{compress}'
        if "iperf" in visitors:
            # UDP rides beside iperf3's TCP control connection on the same port number.
            s += f'\n[server.services.iperf-udp]\ntype = "udp"\nbind = "{LOOPBACK}:{visitors["iperf"]}"\n'
        c = (f'[client]\nserver = "{host}:{server_port}"\n{common}'
             'reconnect_initial_delay = "100ms"\n')
        if quic and (packet or congestion):
            c += "\n[client.quic]\n" + (f"max_packet = {packet}\n" if packet else "") + (
                f'congestion = "{congestion}"\n' if congestion else "")
        for svc, port in targets.items():
            c += f'\n[client.services.{svc}]\ntarget = "{target_host}:{port}"\n{compress}'
        if "iperf" in targets:
            c += f'\n[client.services.iperf-udp]\ntype = "udp"\ntarget = "{target_host}:{targets["iperf"]}"\n'
        (self.dir / "server.toml").write_text(s)
        (self.dir / "client.toml").write_text(c)
        self.client_config = self.dir / "client.toml"
        if quic:
            self.check_quic()
        workers = ([f"--workers={WARREN_WORKERS[self.name]}"]
                   if self.name in WARREN_WORKERS else [])
        self.server = PROCS.start([self.warren, *workers, "--log-level", "warn", "server",
                                   str(self.dir / "server.toml")], self.dir / "server.log")
        try:
            if quic:
                wait_udp_bound(server_port, proc=self.server)
            else:
                wait_listening(server_port, host=host, proc=self.server)
        except BenchError:
            log_text = (self.dir / "server.log").read_text(errors="replace")
            if quic and _exited(self.server) and _lacks_quic(log_text):
                raise Unavailable("not available with this binary: the server exited: "
                                  + _quic_line(log_text, self.dir))
            raise
        self.client = PROCS.start(NET.client_prefix + [
            self.warren, *workers, "--log-level", "warn", "client",
            str(self.dir / "client.toml")], self.dir / "client.log")
        return visitors

    def check_quic(self) -> None:
        """`warren check` both configs: a binary without the QUIC transport rejects
        `transport = "quic"` and `[server.quic]` as unknown. Any other problem (say a
        `max_packet` the binary refuses) is an error of the run, not "not available"."""
        for name in ("server.toml", "client.toml"):
            try:
                p = subprocess.run([self.warren, "check", str(self.dir / name)],
                                   capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.SubprocessError) as e:
                raise BenchError(f"warren check {name}: {e}")
            out = p.stdout + p.stderr
            if p.returncode == 0 or "unrecognized subcommand" in out:
                continue  # valid (or a binary without `check`: starting it will tell)
            if _lacks_quic(out):
                raise Unavailable(f"not available with this binary: {_quic_line(out, self.dir)}")
            raise BenchError(f"warren check {name} failed: {out[-600:]}")


class WarrenP2p(Tunnel):
    """`warren p2p listen` beside the services and `warren p2p connect` beside the
    visitors, one pair per service (a P2P tunnel carries one service; iperf3's UDP gets
    its own pair on the same port number), meeting at a Warren server with [server.p2p]:
    direct, or through the server's relay (`--relay`). Every process counts (server,
    listeners, connects): memory and CPU are the whole system's."""

    def start(self, targets):
        relay = self.name == "warren-p2p-relayed"
        host, target_host = NET.tunnel_host, NET.target_host
        server_port = free_port(udp=True)
        psk = secrets.token_hex(16)
        (self.dir / "server.toml").write_text(
            f'[server]\nbind = "{host}:{server_port}"\npsk = "{psk}"\n'
            "\n[server.p2p]\nrate_per_minute = 1000\n")
        self.server = PROCS.start([self.warren, "--log-level", "warn", "server",
                                   str(self.dir / "server.toml")], self.dir / "server.log")
        wait_listening(server_port, host=host, proc=self.server)
        env = {"WARREN_PSK": psk, "WARREN_SERVER": f"{host}:{server_port}"}
        flags = ["--json"] + (["--relay"] if relay else [])
        visitors = {svc: free_port() for svc in targets}
        pairs = [(svc, "tcp", targets[svc], visitors[svc]) for svc in targets]
        if "iperf" in targets:
            pairs.append(("iperf-udp", "udp", targets["iperf"], visitors["iperf"]))
        self.others: list[subprocess.Popen] = []
        for svc, kind, target, visitor in pairs:
            log_file = self.dir / f"listen-{svc}.log"
            listen = PROCS.start(NET.client_prefix + [
                self.warren, "--log-level", "warn", "p2p", "listen", f"--{kind}",
                f"{target_host}:{target}"] + flags, log_file, env)
            self.others.append(listen)
            code = _wait_json(log_file, "code", listen)["code"]
            self.others.append(PROCS.start([
                self.warren, "--log-level", "warn", "p2p", "connect", "--bind",
                f"{LOOPBACK}:{visitor}"] + flags, self.dir / f"connect-{svc}.log",
                dict(env, WARREN_CODE=code)))
        return visitors

    def pids(self) -> list[int]:
        return super().pids() + [p.pid for p in getattr(self, "others", [])]

    def alive(self) -> bool:
        return super().alive() and all(p.poll() is None for p in getattr(self, "others", []))

    def stop(self) -> None:
        for p in getattr(self, "others", []):
            PROCS.stop(p)
        self.others = []
        super().stop()


def _wait_json(log_file: Path, event: str, proc: subprocess.Popen, timeout: float = 20.0) -> dict:
    """The first `--json` line of `event` a command wrote to `log_file`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log_file.read_text(errors="replace").splitlines():
            if line.startswith("{") and f'"event":"{event}"' in line:
                return json.loads(line)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise BenchError(f"no {event} event in {log_file.name}: "
                     f"{log_file.read_text(errors='replace')[-500:]}")


def _lacks_quic(text: str) -> bool:
    """Whether a config error says this binary does not know QUIC at all: `unknown
    transport `quic`` or `unknown key `quic`` (or "unknown variant" from serde)."""
    return any("unknown" in line.lower() and "quic" in line.lower() for line in text.splitlines())


def _quic_line(text: str, workdir: Path) -> str:
    """The first line of such an error, without the temporary path."""
    for line in text.splitlines():
        if "unknown" in line.lower() and "quic" in line.lower():
            return line.replace(str(workdir) + "/", "").strip()[:200]
    return text.strip().splitlines()[-1][:200] if text.strip() else "(no output)"


class Rathole(Tunnel):
    def start(self, targets):
        exe = tool("rathole", self.bench_home)
        noise = self.name == "rathole-noise"
        host, target_host = NET.tunnel_host, NET.target_host
        server_port = free_port()
        visitors = {svc: free_port() for svc in targets}
        s = f'[server]\nbind_addr = "{host}:{server_port}"\n'
        c = f'[client]\nremote_addr = "{host}:{server_port}"\n'
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
            c += f'\n[client.services.{svc}]\ntoken = "{token}"\nlocal_addr = "{target_host}:{targets[svc]}"\n'
        (self.dir / "server.toml").write_text(s)
        (self.dir / "client.toml").write_text(c)
        env = {"RUST_LOG": "warn"}
        self.server = PROCS.start([exe, "--server", str(self.dir / "server.toml")],
                                  self.dir / "server.log", env)
        wait_listening(server_port, host=host, proc=self.server)
        self.client = PROCS.start(NET.client_prefix + [exe, "--client", str(self.dir / "client.toml")],
                                  self.dir / "client.log", env)
        return visitors


class Frp(Tunnel):
    def start(self, targets):
        frps, frpc = tool("frps", self.bench_home), tool("frpc", self.bench_home)
        tls = self.name == "frp-tls"
        quic = self.name == "frp-quic"
        wss = self.name == "frp-wss"
        host, target_host = NET.tunnel_host, NET.target_host
        server_port = free_port()
        quic_port = free_port(udp=True) if quic else None
        visitors = {svc: free_port() for svc in targets}
        token = secrets.token_hex(16)
        s = (f'bindAddr = "{host}"\nbindPort = {server_port}\n'
             + (f"quicBindPort = {quic_port}\n" if quic else "")
             + f'proxyBindAddr = "{LOOPBACK}"\nauth.token = "{token}"\nlog.level = "warn"\n')
        c = (f'serverAddr = "{host}"\nserverPort = {quic_port if quic else server_port}\n'
             f'auth.token = "{token}"\nloginFailExit = false\nlog.level = "warn"\n')
        if quic:
            # QUIC brings its own TLS 1.3; frp's transport.tls.* keys stay at their defaults.
            c += 'transport.protocol = "quic"\n'
        elif wss:
            # frps takes WebSocket on its port but not WebSocket inside TLS: frp's wss is
            # deployed behind a TLS-terminating proxy, nginx here (counted with frp).
            front = free_port()
            c = c.replace(f"serverPort = {server_port}", f"serverPort = {front}")
            c += 'transport.protocol = "wss"\n'
            self.nginx = self._nginx(front, host, server_port)
        else:
            c += f'transport.tls.enable = {"true" if tls else "false"}\n'
        for svc in targets:
            c += (f'\n[[proxies]]\nname = "{svc}"\ntype = "tcp"\nlocalIP = "{target_host}"\n'
                  f'localPort = {targets[svc]}\nremotePort = {visitors[svc]}\n')
        (self.dir / "frps.toml").write_text(s)
        (self.dir / "frpc.toml").write_text(c)
        self.server = PROCS.start([frps, "-c", str(self.dir / "frps.toml")], self.dir / "server.log")
        wait_listening(server_port, host=host, proc=self.server)
        if quic:
            wait_udp_bound(quic_port, proc=self.server)
        self.client = PROCS.start(NET.client_prefix + [frpc, "-c", str(self.dir / "frpc.toml")],
                                  self.dir / "client.log")
        return visitors

    def _nginx(self, port: int, host: str, frps_port: int) -> subprocess.Popen:
        """nginx terminating TLS on `port` and passing frp's WebSocket path to frps."""
        d = self.dir
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                        "/CN=localhost", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                       check=True, capture_output=True, timeout=30)
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (d / sub).mkdir(exist_ok=True)
        (d / "nginx.conf").write_text(
            f"daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n"
            f"error_log {d}/nginx.error.log warn;\nevents {{ worker_connections 4096; }}\n"
            f"http {{\n access_log off;\n client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n"
            f" fastcgi_temp_path {d}/fastcgi;\n uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n"
            f" server {{ listen {host}:{port} ssl; ssl_protocols TLSv1.2 TLSv1.3;"
            f" ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem;\n"
            f"  location / {{ proxy_pass http://{host}:{frps_port}; proxy_http_version 1.1;"
            f" proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection \"upgrade\";"
            f" proxy_read_timeout 1h; proxy_buffering off; }} }}\n}}\n")
        nginx = "/usr/sbin/nginx" if Path("/usr/sbin/nginx").is_file() else "nginx"
        proc = PROCS.start([nginx, "-c", str(d / "nginx.conf"), "-e", "stderr"], d / "nginx.log")
        wait_listening(port, host=host, proc=proc)
        return proc

    def pids(self) -> list[int]:
        return super().pids() + ([self.nginx.pid] if getattr(self, "nginx", None) else [])

    def stop(self) -> None:
        if getattr(self, "nginx", None) is not None:
            PROCS.stop(self.nginx)
            self.nginx = None
        super().stop()


def make_tunnel(name: str, workdir: Path, bench_home: Path, warren: str) -> Tunnel:
    if name == "raw":
        cls = Raw
    elif name.startswith("warren-p2p"):
        cls = WarrenP2p
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
                s = socket.create_connection((t.visit_host, port), timeout=5)
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


def fig_connect(port: int, n: int, host: str = LOOPBACK) -> dict:
    """n sequential connect + 1-byte echo + close; latency of connect + first byte."""
    for _ in range(20):  # warm-up
        echo_once(port, host=host)
    lat = []
    failed = 0
    t0 = time.perf_counter()
    for _ in range(n):
        a = time.perf_counter()
        try:
            with socket.create_connection((host, port), timeout=5) as s:
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


def fig_rtt(port: int, seconds: int, host: str = LOOPBACK) -> dict:
    argv = ["sockperf", "pp", "--tcp", "-i", host, "-p", str(port), "-m", "64",
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
    argv = ["iperf3", "-c", t.visit_host, "-p", str(port), "-t", str(seconds), "-J"] + extra
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


UDP_VARIANTS = {
    # The issue's figure: iperf3's own receive buffer (the system default, ~200 KB).
    "udp": [],
    # The replies' direction through the tunnel.
    "udp_r": ["-R"],
    # A receiver that keeps up: the 4 MB socket buffer an application that wants UDP
    # throughput asks for (the default holds ~90 datagrams, and a tunnel delivers in bursts).
    "udp_w": ["-w", "4M"],
}


def fig_udp(port: int, seconds: int, host: str = LOOPBACK, key: str = "udp") -> dict:
    """iperf3 -u -b 0 (as fast as the sender can go): receiver Gbit/s and loss, for one of
    UDP_VARIANTS."""
    argv = ["iperf3", "-c", host, "-p", str(port), "-u", "-b", "0", "-l", "1400",
            "-t", str(seconds), "-J"] + UDP_VARIANTS[key]
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
            return {f"{key}_gbps": recv["bits_per_second"] / 1e9,
                    f"{key}_loss_pct": end.get("sum", recv).get("lost_percent", 0.0)}
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
    if name == "warren-baseline":
        if not args.baseline_warren:
            return {"errors": [], "unavailable": "needs --baseline-warren PATH"}
        warren = args.baseline_warren
    t = make_tunnel(name, workdir, args.bench_home, warren)
    res: dict = {"errors": []}
    host = LOOPBACK
    try:
        visitors = t.start(svc.ports)
        host = t.visit_host
        res["ready_s"] = round(wait_forwarding(visitors["echo"], host=host), 3)
        if name in ("warren-default", "warren-baseline"):
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
        step("connect", lambda: fig_connect(visitors["echo"], args.connects, host))
        if not args.no_sockperf:
            step("rtt", lambda: fig_rtt(visitors["sockperf"], args.sockperf_time, host))
        for key, extra in (("p1", []), ("p4", ["-P", "4"]), ("r", ["-R"])):
            if key in args.iperf_modes:
                step(f"iperf3 {key}", lambda extra=extra, key=key: {
                    f"{key}_{k}": v for k, v in fig_iperf(t, visitors["iperf"], args.iperf_time, extra).items()})
        if "udp" in args.iperf_modes and name.startswith(("raw", "warren")):
            for key, extra in UDP_VARIANTS.items():
                step(f"iperf3 udp {' '.join(extra)}".rstrip(), lambda key=key: fig_udp(
                    visitors["iperf"], args.iperf_time, host, key))
        if not t.alive():
            res["errors"].append("a tunnel process exited during the run")
    except Unavailable as e:
        res["unavailable"] = str(e)
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


def versions(bench_home: Path, warren: str, configs: list[str], baseline: str | None = None) -> dict:
    v = {
        "warren": (sh([warren, "--version"]).splitlines() or [""])[0].removeprefix("warren "),
        "warren commit": sh(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
        "warren baseline": f"{baseline} ({(sh([baseline, '--version']).splitlines() or [''])[0]})"
        if baseline else "",
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


def per_run_ratio(doc: dict, cfg: str, key: str, base: str,
                  base_key: str | None = None) -> float | None:
    """Median over runs of cfg's key / base's base_key (default: the same key), each
    ratio taken within one run."""
    vals = []
    for run in doc["runs"]:
        a = run["configs"].get(cfg, {}).get(key)
        b = run["configs"].get(base, {}).get(base_key or key)
        if a is not None and b:
            vals.append(a / b)
    return statistics.median(vals) if vals else None


def med(doc: dict, cfg: str, key: str) -> float | None:
    vals = [run["configs"][cfg][key] for run in doc["runs"]
            if key in run["configs"].get(cfg, {})]
    return statistics.median(vals) if vals else None


def fmt(v, spec="{:.2f}") -> str:
    return "—" if v is None else spec.format(v)


def is_netns(doc: dict) -> bool:
    return bool(doc.get("settings", {}).get("netns"))


def label(doc: dict, cfg: str) -> str:
    if is_netns(doc) and cfg in NETNS_LABELS:
        return NETNS_LABELS[cfg]
    return LABELS.get(cfg, cfg)


def unavailable(doc: dict) -> dict[str, str]:
    """Configs this run could not measure with the binary it had, and why (first reason)."""
    out: dict[str, str] = {}
    for run in doc["runs"]:
        for cfg, v in run["configs"].items():
            if v.get("unavailable"):
                out.setdefault(cfg, v["unavailable"])
    return out


def udp_reference(doc: dict) -> str:
    """The config whose UDP figure stands for "today's Warren" in issue 14's UDP target:
    the binary before the change (--baseline-warren) when it was measured, else
    warren-default (the TCP transport with the default config) of the same run."""
    if med(doc, "warren-baseline", "udp_gbps") is not None:
        return "warren-baseline"
    return "warren-default"


def targets(doc: dict) -> list[tuple[str, str, str, bool | None]]:
    """(config, target, measured, met) from the issues' goals, ratios within each run.
    A target is listed only when its config and the config it compares with were run."""
    out = []
    present = set(doc["configs"])

    def ratio_target(cfg, key, base, factor, label, le=False, base_key=None):
        if cfg not in present or base not in present:
            return
        r = per_run_ratio(doc, cfg, key, base, base_key)
        met = None if r is None else (r <= factor if le else r >= factor)
        out.append((cfg, label, fmt(r, "{:.2f}×"), met))

    def abs_target(cfg, key, limit, label, unit):
        if cfg not in present:
            return
        v = med(doc, cfg, key)
        out.append((cfg, label, fmt(v, "{:.1f} " + unit), None if v is None else v <= limit))

    for cfg in ("warren-aes128", "warren-aes256"):
        for key, fig in (("p1_gbps", "P1"), ("p4_gbps", "P4"), ("r_gbps", "-R")):
            ratio_target(cfg, key, "rathole-tcp", 1.0, f"{fig} ≥ rathole-tcp")
            ratio_target(cfg, key, "rathole-noise", 2.0, f"{fig} ≥ 2× rathole-noise")
        ratio_target(cfg, "rtt_p50_us", "rathole-tcp", 0.7, "RTT p50 ≤ 0.7× rathole-tcp", le=True)
        ratio_target(cfg, "rtt_p99_us", "rathole-tcp", 1.0, "RTT p99 ≤ rathole-tcp", le=True)
        abs_target(cfg, "kb_per_idle_conn", 16, "≤ 16 KB per idle connection", "KB")
        abs_target(cfg, "connect_p50_us", 250, "connect + first byte p50 ≤ 250 µs", "µs")
        ratio_target(cfg, "conn_per_s", "rathole-tcp", 2.0, "conn/s ≥ 2× rathole-tcp")
    ratio_target("warren-tcp", "p1_gbps", "rathole-tcp", 1.3, "P1 ≥ 1.3× rathole-tcp")
    for key, fig in (("p1_gbps", "P1"), ("r_gbps", "-R")):
        ratio_target("warren-lz4", key, "warren-default", 0.95,
                     f"lz4 on random data: {fig} ≥ 0.95× without compression")
    # Issue 19: the web-looking transports, P1 ≥ 2× frp's wss and ≥ 0.7× Warren noise.
    for cfg in ("warren-tls", "warren-wss"):
        ratio_target(cfg, "p1_gbps", "frp-wss", 2.0, "P1 ≥ 2× frp-wss")
        ratio_target(cfg, "p1_gbps", "warren-default", 0.7, "P1 ≥ 0.7× Warren noise")
    # Issue 20: encryption with the default config within 15 % of plaintext.
    for key, fig in (("p1_gbps", "P1"), ("p4_gbps", "P4"), ("r_gbps", "-R")):
        ratio_target("warren-default", key, "warren-tcp", 0.85, f"{fig} ≥ 0.85× Warren plaintext")
        ratio_target("warren-default", key, "rathole-tcp", 1.6, f"{fig} ≥ 1.6× rathole-tcp")
    ratio_target("warren-default", "p1_cpu_s_per_gb", "warren-tcp", 1.25,
                 "CPU s/GB ≤ 1.25× Warren plaintext", le=True)
    for key, fig in (("p1_gbps", "P1"), ("p4_gbps", "P4"), ("r_gbps", "-R")):
        ratio_target("warren-chacha20", key, "rathole-noise", 1.5, f"{fig} ≥ 1.5× rathole-noise")

    # Issue 14, QUIC. 1452-byte packets: P1 ≥ 2× frp-quic; P4 and -R ≥ 0.9× its own P1.
    # (warren-quic-1w: the same packets with one worker per process, an option users have.)
    for cfg in ("warren-quic", "warren-quic-1w"):
        ratio_target(cfg, "p1_gbps", "frp-quic", 2.0, "P1 ≥ 2× frp-quic")
        ratio_target(cfg, "p4_gbps", cfg, 0.9, "P4 ≥ 0.9× its P1", base_key="p1_gbps")
        ratio_target(cfg, "r_gbps", cfg, 0.9, "-R ≥ 0.9× its P1", base_key="p1_gbps")
    # Loopback packets: P1 ≥ rathole-tcp (plaintext).
    ratio_target("warren-quic-loopback", "p1_gbps", "rathole-tcp", 1.0, "P1 ≥ rathole-tcp")
    # Latency and memory, for QUIC whatever the packet size.
    for cfg in ("warren-quic", "warren-quic-loopback", "warren-quic-1w"):
        ratio_target(cfg, "rtt_p50_us", "frp-quic", 0.6, "RTT p50 ≤ 0.6× frp-quic", le=True)
        ratio_target(cfg, "connect_p50_us", "frp-quic", 0.5, "connect + first byte p50 ≤ 0.5× frp-quic",
                     le=True)
        abs_target(cfg, "kb_per_idle_conn", 16, "≤ 16 KB per idle connection", "KB")
    # Issue 18: a direct P2P tunnel (one hop fewer) ≥ 0.9× a Warren QUIC server tunnel;
    # both kinds of server tunnel, since the P2P one on loopback uses loopback's packets.
    for base in ("warren-quic", "warren-quic-loopback"):
        for key, fig in (("p1_gbps", "P1"), ("p4_gbps", "P4"), ("r_gbps", "-R")):
            ratio_target("warren-p2p", key, base, 0.9, f"{fig} ≥ 0.9× {base}")
    # UDP goodput at -b 0: ≥ 2× today's Warren UDP figure in the same run, loss ≤ 10 %, on
    # both transports. "Today's" is the binary before the change when --baseline-warren
    # measured it in this run; without it, warren-default of the same run (the QUIC rows
    # then compare with the TCP transport as it is in this binary).
    ref = udp_reference(doc)
    for cfg in ("warren-quic", "warren-quic-loopback"):
        ratio_target(cfg, "udp_gbps", ref, 2.0, f"UDP ≥ 2× {ref} (today's Warren UDP)")
        abs_target(cfg, "udp_loss_pct", 10, "UDP loss ≤ 10 %", "%")
    if "warren-default" in present:
        if ref == "warren-baseline":
            ratio_target("warren-default", "udp_gbps", ref, 2.0, f"UDP ≥ 2× {ref} (today's Warren UDP)")
        elif any(c in present for c in WARREN_QUIC_PACKET):
            out.append(("warren-default", "UDP ≥ 2× today's Warren UDP", "— (needs --baseline-warren "
                        "for a same-run figure)", None))
        if any(c in present for c in WARREN_QUIC_PACKET) or ref == "warren-baseline":
            abs_target("warren-default", "udp_loss_pct", 10, "UDP loss ≤ 10 %", "%")
    return out


def row_label(doc: dict, cfg: str) -> str:
    """The config's name, with the cipher(s) a default config picked in these runs."""
    picked = sorted({run["configs"][cfg]["cipher"] for run in doc["runs"]
                     if "cipher" in run["configs"].get(cfg, {})})
    text = label(doc, cfg) + (f": {', '.join(picked)}" if picked else "")
    if cfg in unavailable(doc) and med(doc, cfg, "p1_gbps") is None:
        text += " (not available with this binary)"
    return text


def render(doc: dict, heading: str = "#") -> str:
    m = doc["machine"]
    cfgs = [c for c in DISPLAY_ORDER if c in doc["configs"]]
    n = len(doc["runs"])
    loads = ", ".join(f"{r['loadavg_before']:.2f}" for r in doc["runs"])
    noisy = any(r["loadavg_before"] > 0.5 for r in doc["runs"])
    netns = doc["settings"].get("netns")
    if netns:
        title = f"{heading} Through network namespaces (veth, MTU {netns['mtu']})"
        where = [
            f"- Path: tunnel server and visitors (iperf3 -c, sockperf pp, the echo clients) in one "
            f"network namespace ({netns['server_addr']}), tunnel client and local services in another "
            f"({netns['client_addr']}), one veth pair with MTU {netns['mtu']} between them (offloads at "
            "their defaults: TCP still hands the kernel 64 KB segments, while every QUIC datagram must "
            "fit the MTU). No delay, loss or rate limit: this shows packet size, not distance. The "
            "`raw` row connects across the veth without a tunnel.",
        ]
    else:
        title = f"{heading} Benchmark results"
        where = []
    lines = [
        title,
        "",
        f"- Date: {doc['date']}" + (f" ({doc['seconds'] / 60:.0f} minutes)" if doc.get("seconds") else ""),
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}, Linux {m['kernel']}"
        + (f" (CPU features: {m['cpu_features']})" if m.get("cpu_features") else ""),
        *where,
        f"- Runs: {n} (medians shown; ratios are computed within each run, then the median taken)",
        f"- iperf3 `-t {doc['settings']['iperf_time']}`; sockperf `-t {doc['settings']['sockperf_time']}`; "
        f"{doc['settings']['idle_conns']} idle connections; {doc['settings']['connects']} sequential connects"
        + (f"; QUIC loopback packets: {doc['settings']['quic_loopback_packet']} bytes"
           if "warren-quic-loopback" in cfgs and doc["settings"].get("quic_loopback_packet") else ""),
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
    missing = unavailable(doc)
    if missing:
        lines += ["", "Not measured:", ""]
        lines += [f"- {label(doc, c)}: {why}" for c, why in missing.items()]
    choices = [(r["run"], c, r["configs"][c]["cipher_choice"]) for r in doc["runs"] for c in cfgs
               if "cipher_choice" in r["configs"].get(c, {})]
    if choices:
        lines += ["", "How the default config chose (seal/open GB/s on one core, measured by each "
                  "side at start-up):", ""]
        lines += [f"- run {run}, {label(doc, c)}: {how}" for run, c, how in choices]
    ratio_cols = [
        ("P1 / rathole-tcp", "p1_gbps", "rathole-tcp"), ("P4 / rathole-tcp", "p4_gbps", "rathole-tcp"),
        ("-R / rathole-tcp", "r_gbps", "rathole-tcp"), ("P1 / raw", "p1_gbps", "raw"),
        ("P4 / raw", "p4_gbps", "raw"), ("-R / raw", "r_gbps", "raw"),
        ("RTT p50 / rathole-tcp", "rtt_p50_us", "rathole-tcp"),
        ("conn/s / rathole-tcp", "conn_per_s", "rathole-tcp"),
    ]
    if "frp-quic" in cfgs:
        ratio_cols += [("P1 / frp-quic", "p1_gbps", "frp-quic"),
                       ("RTT p50 / frp-quic", "rtt_p50_us", "frp-quic"),
                       ("connect p50 / frp-quic", "connect_p50_us", "frp-quic")]
    ratio_cols = [col for col in ratio_cols if col[2] in cfgs]
    if ratio_cols and any(c != "raw" for c in cfgs):
        lines += [
            "",
            f"{heading}# Ratios (within each run, median over runs)",
            "",
            "| config | " + " | ".join(h for h, _, _ in ratio_cols) + " |",
            "|---|" + "---|" * len(ratio_cols),
        ]
        for c in cfgs:
            if c == "raw":
                continue
            row = [fmt(per_run_ratio(doc, c, k, base)) for _, k, base in ratio_cols]
            lines.append(f"| {label(doc, c)} | " + " | ".join(row) + " |")
    udp = [c for c in cfgs if med(doc, c, "udp_gbps") is not None]
    if udp:
        ref = udp_reference(doc)
        ref = ref if ref in udp else None  # the ratio column only when the reference ran
        keys = [k for k in UDP_VARIANTS if any(med(doc, c, f"{k}_gbps") is not None for c in udp)]
        head, rule = "| config |", "|---|"
        for key in keys:
            flags = " ".join(UDP_VARIANTS[key])
            name = f"{flags} " if flags else ""
            head += f" {name}Gbit/s | {name}loss % |" + (f" {name}/ {ref} |" if ref else "")
            rule += "---|---|" + ("---|" if ref else "")
        lines += ["", f"{heading}# UDP (iperf3 `-u -b 0 -l 1400`, receiver)", "", head, rule]
        for c in udp:
            row = f"| {label(doc, c)} |"
            for key in keys:
                row += (f" {fmt(med(doc, c, f'{key}_gbps'))} "
                        f"| {fmt(med(doc, c, f'{key}_loss_pct'), '{:.1f}')} |"
                        + (f" {fmt(per_run_ratio(doc, c, f'{key}_gbps', ref), '{:.2f}×')} |" if ref else ""))
            lines.append(row)
    tg = targets(doc)
    if tg:
        lines += ["", f"{heading}# Targets from the issue", "",
                  "| config | target | measured | met? |", "|---|---|---|---|"]
        for cfg, what, measured, met in tg:
            mark = "—" if met is None else ("met" if met else "**not met**")
            lines.append(f"| {label(doc, cfg)} | {what} | {measured} | {mark} |")
    errs = [(r["run"], c, e) for r in doc["runs"] for c, v in r["configs"].items() for e in v.get("errors", [])]
    if errs:
        lines += ["", "Errors:", ""] + [f"- run {r}, {c}: {e}" for r, c, e in errs]
    lines += ["", "How each figure is measured: [bench/README.md](bench/README.md). "
              "Raw data: `bench/results/" + doc["json_name"] + "`."]
    return "\n".join(lines) + "\n"


NETNS_SECTION = "\n## Through network namespaces"
SCALE_SECTION = "\n## Scale"


def split_results(text: str) -> tuple[str, str, str]:
    """RESULTS.md as (loopback run, network-namespace section, scale section)."""
    ends = [i for i in (text.find(NETNS_SECTION), text.find(SCALE_SECTION)) if i >= 0]
    main_end = min(ends) if ends else len(text)
    ns_at, sc_at = text.find(NETNS_SECTION), text.find(SCALE_SECTION)
    netns = ""
    if ns_at >= 0:
        netns = text[ns_at:sc_at if sc_at > ns_at else len(text)]
    scale = ""
    if sc_at >= 0:
        scale = text[sc_at:ns_at if ns_at > sc_at else len(text)]
    return text[:main_end], netns, scale


def replace_section(heading: str, section: str) -> None:
    """Replaces the section of bench/RESULTS.md that starts with `heading` (up to the next
    `## `) with `section`, or appends it. For the other harnesses' sections, which
    `write_outputs` keeps since they come after "## Scale"."""
    path = HERE / "RESULTS.md"
    text = path.read_text() if path.exists() else ""
    at = text.find("\n" + heading)
    if at < 0:
        path.write_text(text.rstrip("\n") + "\n\n" + section)
        return
    nxt = text.find("\n## ", at + 1)
    rest = text[nxt:] if nxt >= 0 else ""
    path.write_text(text[:at].rstrip("\n") + "\n\n" + section + rest)


def write_outputs(doc: dict) -> None:
    results = HERE / "RESULTS.md"
    old = results.read_text() if results.exists() else ""
    main, netns, scale = split_results(old)
    if is_netns(doc):
        # A --netns run only replaces its own section of RESULTS.md; README.md's table is
        # the loopback run's.
        section = render(doc, "##").replace("](bench/README.md)", "](README.md)")
        results.write_text(main.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n" + scale)
        return
    body = render(doc, "#").replace("](bench/README.md)", "](README.md)")
    # The "## Scale" section comes from bench/scale.py and the network-namespace one from
    # `run --netns`, not from this run: keep them.
    results.write_text(body + netns + scale)
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
    if any(c in doc["configs"] for c in WARREN_QUIC_PACKET):
        intro += (
            "\n"
            "Loopback is not the internet: its MTU is 65536 and it has no delay or loss. The QUIC\n"
            "rows with 1452-byte packets are closest to an internet path; `bench/run.sh --netns`\n"
            "measures them across a 1500-byte veth between two network namespaces\n"
            "([bench/RESULTS.md](bench/RESULTS.md), section \"Through network namespaces\").\n"
        )
    # Summaries other harnesses' runs put in the section (HTTP, ...) stay, between markers.
    kept = ""
    start, end = "<!-- bench-extra:start -->", "<!-- bench-extra:end -->"
    if start in text[idx:] and end in text[idx:]:
        kept = "\n" + text[text.index(start, idx):text.index(end, idx) + len(end)] + "\n"
    readme.write_text(text[:idx] + intro + kept + section)


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
        configs = args.only or list(NETNS_CONFIGS if args.netns else DEFAULT_CONFIGS)
    if args.baseline_warren and "warren-baseline" not in configs:
        configs = list(configs) + ["warren-baseline"]
    unknown = [c for c in configs if c not in ALL_CONFIGS]
    if unknown:
        log(f"unknown config(s) {', '.join(unknown)}; known: {', '.join(ALL_CONFIGS)}")
        return 2
    configs = [c for c in ALL_CONFIGS if c in configs]
    warren = args.warren or str(REPO / "target" / "release" / "warren")
    if not os.access(warren, os.X_OK):
        log(f"no warren binary at {warren}: run `cargo build --release` first")
        return 2
    if args.baseline_warren and not os.access(args.baseline_warren, os.X_OK):
        log(f"--baseline-warren {args.baseline_warren} is not an executable")
        return 2
    if not shutil.which("iperf3") or (not args.no_sockperf and not shutil.which("sockperf")):
        log("iperf3 and sockperf are needed (bench/run.sh installs them)")
        return 2

    netns = None
    if args.netns:
        NET.netns = NetnsPair(args.mtu)
        NET.tunnel_host, NET.target_host = NETNS_SERVER_ADDR, NETNS_CLIENT_ADDR
        NET.client_prefix = NET.netns.client_prefix()
        netns = {"mtu": args.mtu, "server_addr": NETNS_SERVER_ADDR, "client_addr": NETNS_CLIENT_ADDR}

    now = dt.datetime.now(dt.timezone.utc)
    doc = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "json_name": now.strftime("%Y%m%d-%H%M%S") + ("-netns" if netns else "") + ".json",
        "machine": machine_info(),
        "versions": versions(args.bench_home, warren, configs, args.baseline_warren),
        "settings": {
            "iperf_time": args.iperf_time, "sockperf_time": args.sockperf_time,
            "idle_conns": args.idle_conns, "connects": args.connects,
            "iperf_modes": args.iperf_modes, "smoke": args.smoke,
            "idle_connection_method": "connect, send 1 byte, read the 1-byte echo, then hold",
            "netns": netns,
            "quic_loopback_packet": QUIC_LOOPBACK_PACKET,
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
                    if res.get("unavailable"):
                        log(f"  {cfg}: {res['unavailable']} (not measured; the run goes on)")
                        continue
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
            if r.get("unavailable"):
                log(f"SMOKE FAILED: {cfg}: {r['unavailable']}")
                return 1
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
        log("wrote bench/RESULTS.md's network-namespace section" if netns
            else "wrote bench/RESULTS.md and the README Benchmarks section")
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
    r.add_argument("--netns", action="store_true",
                   help="tunnel server and visitors in one network namespace, tunnel client and local "
                   "services in another, one veth (--mtu) between them; needs root. Default configs: "
                   + ",".join(NETNS_CONFIGS))
    r.add_argument("--mtu", type=int, default=1500, help="the veth's MTU with --netns (default 1500)")
    r.add_argument("--baseline-warren", metavar="PATH",
                   help="also measure this Warren binary (the one before a change) as warren-baseline, "
                   "default config, in the same run: the reference for 'today's Warren' figures")
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
    e.add_argument("host", nargs="?", default=LOOPBACK)
    d = sub.add_parser("render", help="print (and with --write-results, write) the tables of a JSON file")
    d.add_argument("json", type=Path)
    d.add_argument("--write-results", action="store_true")
    args = ap.parse_args()

    if args.cmd == "serve-echo":
        serve_echo(args.port, args.host)
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
        if NET.netns is not None:
            NET.netns.close()


if __name__ == "__main__":
    sys.exit(main())
