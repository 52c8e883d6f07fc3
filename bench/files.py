#!/usr/bin/env python3
"""File-transfer benchmark (issue 17): `warren send` / `warren receive`, direct and
relayed, against scp (default and aes128-gcm), rsync over ssh, croc --no-compress (a
local relay) and sendme, everything on this machine's loopback.

    bench/run.sh --files               # full run (~15-20 minutes), writes bench/results/
                                       # files-DATE.json, RESULTS.md's "File transfer" section
                                       # and README.md's rows between the files-bench markers
    bench/run.sh --files --smoke       # ~10 s: Warren only, one small tree, direct + relayed,
                                       # bytes verified by hash; exits non-zero on failure
    python3 bench/files.py run --help  # every option
    python3 bench/files.py render bench/results/files-DATE.json [--write-results]

Python 3 standard library only; process handling and machine facts come from bench.py.
See bench/README.md, section "File transfer", for what is measured and how.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as B  # noqa: E402  (bench.py: processes, ports, machine facts)

HERE = B.HERE
REPO = B.REPO
LOOPBACK = B.LOOPBACK
PSK = "files-bench-psk-" + "0123456789abcdef" * 2
SECTION = "## File transfer (issue 17)"
README_START = "<!-- files-bench:start -->"
README_END = "<!-- files-bench:end -->"

MIB = 1 << 20
GIB = 1 << 30
# name -> (label, list of (relative path, size)); made once per run, random contents.
DATASETS = {
    "1GiB": ("1 GiB, one file", [("big.bin", GIB)]),
    "1000x1MiB": ("1000 × 1 MiB", [(f"d{i // 100:02d}/f{i:04d}.bin", MIB) for i in range(1000)]),
    "10000x4KiB": ("10 000 × 4 KiB", [(f"d{i // 100:03d}/f{i:05d}.bin", 4096) for i in range(10000)]),
}
SMOKE_DATASET = ("smoke", [("a.bin", 3 * MIB + 17)] + [(f"sub/f{i:02d}.bin", 1000 + i * 4099) for i in range(30)]
                 + [("sub/deeper/empty", 0)])

TOOLS = ["warren-direct", "warren-relay", "scp", "scp-aes128gcm", "rsync", "croc", "sendme"]
LABELS = {
    "warren-direct": "Warren, direct",
    "warren-relay": "Warren, relayed (`--relay`)",
    "scp": "scp (default cipher)",
    "scp-aes128gcm": "scp `-c aes128-gcm@openssh.com`",
    "rsync": "rsync -a over ssh",
    "croc": "croc `--no-compress`, local relay",
    "sendme": "sendme (own netns, lo only)",
}
TIMEOUT = 600.0


def log(msg: str) -> None:
    print(f"files: {msg}", file=sys.stderr, flush=True)


class Failed(Exception):
    pass


# ---------------------------------------------------------------- data


def make_dataset(root: Path, files: list[tuple[str, int]]) -> dict[str, str]:
    """Writes random files under root; returns {relative path: sha256}."""
    sums = {}
    for rel, size in files:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        with open(p, "wb") as f:
            left = size
            while left:
                chunk = os.urandom(min(left, 8 * MIB))
                f.write(chunk)
                h.update(chunk)
                left -= len(chunk)
        sums[rel] = h.hexdigest()
    return sums


def warm(root: Path) -> None:
    """Reads every source file so it sits in the page cache."""
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            with open(os.path.join(dirpath, n), "rb") as f:
                while f.read(8 * MIB):
                    pass


def touch_free_memory(workdir: Path, nbytes: int) -> None:
    """Writes nbytes of zeros through the page cache into a scratch file and deletes it, so
    the next transfer's page cache comes from memory the guest touched a moment ago.

    Why: this VM reports free memory to its host (virtio-balloon free page reporting), and
    the first write into a reported page costs a host fault. Measured here, `dd` of 1 GiB into
    the page cache took 1.98 s (sys 1.96) when it was the first large allocation after a few
    quiet seconds and 0.2 s right after another 1 GiB had been freed. Without this step the
    first large transfer of every run (always the same tool) paid for it: Warren direct's
    1 GiB took 2.6-3.9 s in the harness and 1.7 s by hand. Freed pages go to the head of
    the kernel's free lists, so whichever tool comes next reuses them."""
    scratch = workdir / "touch-free-memory"
    chunk = bytes(8 * MIB)
    with open(scratch, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(chunk[:min(left, len(chunk))])
            left -= len(chunk)
    scratch.unlink()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(8 * MIB)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def verify(got_root: Path, sums: dict[str, str]) -> None:
    """Every expected file is under got_root with the same bytes, and nothing else."""
    seen = set()
    for dirpath, dirs, names in os.walk(got_root):
        dirs[:] = [d for d in dirs if not d.startswith(".sendme-")]
        for n in names:
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, got_root)
            if rel not in sums:
                raise Failed(f"unexpected file {rel} in the output")
            if sha256_file(full) != sums[rel]:
                raise Failed(f"{rel}: contents differ from the source")
            seen.add(rel)
    missing = set(sums) - seen
    if missing:
        raise Failed(f"{len(missing)} files missing from the output, e.g. {sorted(missing)[0]}")


def both_exit(tool: str, snd, rcv, stop, watcher) -> None:
    """Waits for the receiving side (TIMEOUT), then stops the first-byte watcher and waits
    for the sending side (30 s); `Failed` with the side's output when either exits non-zero."""
    rc = rcv.wait(TIMEOUT)
    stop.set()
    watcher.join(2)
    if rc != 0:
        raise Failed(f"{tool} receive exited {rc}: {rcv.stderr()[-800:]} {rcv.stdout()[-800:]}")
    rc = snd.wait(30)
    if rc != 0:
        raise Failed(f"{tool} send exited {rc}: {snd.stderr()[-800:]}")


def first_byte_watch(root: Path, stop: threading.Event, out: dict) -> threading.Thread:
    """Polls root (recursively, hidden names included) every ~1 ms until some regular file
    in it has a size above 0; stores the monotonic time in out["t"]."""

    def scan(d: str) -> bool:
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            if scan(e.path):
                                return True
                        elif e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_size > 0:
                            return True
                    except OSError:
                        pass
        except OSError:
            pass
        return False

    def run():
        while not stop.is_set():
            if scan(str(root)):
                out["t"] = time.monotonic()
                return
            time.sleep(0.001)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------- processes


class Proc:
    """A command under /usr/bin/time -f %M (peak RSS in KiB), its stdout read line by line
    with the monotonic time each line arrived."""

    def __init__(self, argv: list[str], workdir: Path, name: str, env: dict | None = None,
                 cwd: Path | None = None, prefix: list[str] | None = None):
        self.rss_file = workdir / f"{name}.rss"
        self.rss_file.unlink(missing_ok=True)
        self.err_file = workdir / f"{name}.err"
        full_env = dict(os.environ)
        full_env.update(env or {})
        err = open(self.err_file, "wb")
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(
            (prefix or []) + ["/usr/bin/time", "-f", "%M", "-o", str(self.rss_file)] + argv,
            stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=full_env,
            cwd=cwd, start_new_session=True, preexec_fn=B._die_with_parent,
        )
        err.close()
        B.PROCS.procs.append(self.p)
        self.lines: list[tuple[float, str]] = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.p.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            with self.cond:
                self.lines.append((time.monotonic(), line))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_line(self, pattern: str, timeout: float) -> tuple[float, re.Match]:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        i = 0
        with self.cond:
            while True:
                while i < len(self.lines):
                    m = rx.search(self.lines[i][1])
                    if m:
                        return self.lines[i][0], m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and not self.reader.is_alive()):
                    raise Failed(f"no line matching {pattern!r} within {timeout:.0f} s; "
                                 f"stderr: {self.stderr()[-600:]}")
                self.cond.wait(min(left, 0.2))

    def wait(self, timeout: float) -> int:
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise Failed(f"timed out after {timeout:.0f} s; stderr: {self.stderr()[-600:]}")
        self.t_exit = time.monotonic()
        self.reader.join(timeout=5)
        if self.p in B.PROCS.procs:
            B.PROCS.procs.remove(self.p)
        return rc

    def interrupt(self) -> None:
        """SIGINT to the process group (GNU time ignores it and waits for the command)."""
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait(timeout=5)
        if self.p in B.PROCS.procs:
            B.PROCS.procs.remove(self.p)

    def rss_mib(self) -> float | None:
        try:
            return int(self.rss_file.read_text().strip().splitlines()[-1]) / 1024
        except (OSError, ValueError, IndexError):
            return None

    def stdout(self) -> str:
        return "\n".join(l for _, l in self.lines)

    def stderr(self) -> str:
        try:
            return self.err_file.read_text(errors="replace")
        except OSError:
            return ""


# ---------------------------------------------------------------- peers


class WarrenServer:
    def __init__(self, warren: str, workdir: Path, host: str = LOOPBACK):
        port = B.free_port(udp=True)
        cfg = workdir / "warren-server.toml"
        cfg.write_text(f'[server]\nbind = "{host}:{port}"\npsk = "${{WARREN_PSK}}"\n\n'
                       "[server.p2p]\nrate_per_minute = 10000\n")
        self.addr = f"{host}:{port}"
        self.proc = B.PROCS.start([warren, "server", str(cfg)], workdir / "warren-server.log",
                                  env={"WARREN_PSK": PSK, "WARREN_LOG": "warn"})
        B.wait_listening(port, host=host, proc=self.proc)
        B.wait_udp_bound(port, proc=self.proc)

    def env(self) -> dict:
        return {"WARREN_PSK": PSK, "WARREN_SERVER": self.addr}

    def hwm_mib(self) -> float | None:
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None


class Sshd:
    """An sshd of our own on `host` (127.0.0.1 by default): own port, host key, authorized
    key and config in the run's temporary directory; the system's sshd config is not read."""

    def __init__(self, workdir: Path, host: str = LOOPBACK):
        d = workdir / "ssh"
        d.mkdir(mode=0o700)
        self.dir = d
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)],
                           check=True, stdin=subprocess.DEVNULL)
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        self.port = B.free_port()
        sftp = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server")
                     if os.path.exists(p)), "internal-sftp")
        (d / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress {host}\nHostKey {d / 'host_key'}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\nPidFile {d / 'sshd.pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\n"
            f"Subsystem sftp {sftp}\nLogLevel ERROR\n")
        os.makedirs("/run/sshd", exist_ok=True)  # privilege separation directory
        self.proc = B.PROCS.start(["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")],
                                  workdir / "sshd.log")
        self.host = host
        B.wait_listening(self.port, host=host, proc=self.proc)
        self.user = os.environ.get("USER") or subprocess.run(
            ["id", "-un"], capture_output=True, text=True).stdout.strip()

    def ssh_opts(self) -> list[str]:
        return ["-F", "/dev/null", "-i", str(self.dir / "client_key"), "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={self.dir / 'known_hosts'}",
                "-o", "LogLevel=ERROR"]

    def ssh_cmd(self) -> str:
        return " ".join(["ssh", "-p", str(self.port)] + self.ssh_opts())


class CrocRelay:
    def __init__(self, croc: str, workdir: Path, host: str = LOOPBACK):
        ports = [B.free_port() for _ in range(5)]
        self.addr = f"{host}:{ports[0]}"
        self.proc = B.PROCS.start([croc, "relay", "--host", host, "--ports",
                                   ",".join(map(str, ports))], workdir / "croc-relay.log",
                                  env={"HOME": str(workdir / "croc-home")})
        B.wait_listening(ports[0], host=host, proc=self.proc)


class Netns:
    """A network namespace with only `lo` up (sendme runs there: nothing it sends can leave
    the machine, whatever its defaults try)."""

    def __init__(self):
        # Namespaces a killed run left behind (their PID is gone) go first.
        for line in B.sh(["ip", "netns", "list"]).splitlines():
            m = re.match(r"warren-files-(\d+)\b", line)
            if m and not B._pid_alive(int(m.group(1))):
                subprocess.run(["ip", "netns", "del", f"warren-files-{m.group(1)}"], check=False)
        if os.geteuid() != 0:
            raise Failed("sendme runs in a network namespace of its own, which needs root "
                         "(leave it out with --only)")
        self.name = f"warren-files-{os.getpid()}"
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)
        self.prefix = ["ip", "netns", "exec", self.name]

    def close(self):
        subprocess.run(["ip", "netns", "del", self.name], check=False)


# ---------------------------------------------------------------- one transfer


def run_one(tool: str, ds: str, src: Path, send_path: Path, dst: Path, ctx: dict) -> dict:
    """One transfer of send_path (a file or a folder under src) into dst, which is empty.
    Returns the figures; raises Failed. The receiving side runs behind ctx["recv_prefix"]
    (e.g. `ip netns exec` into the far side of bench/wan.py's lab), if given."""
    wd: Path = ctx["workdir"]
    recv_prefix: list[str] = ctx.get("recv_prefix", [])
    res: dict = {}
    stop = threading.Event()
    fb: dict = {}
    if tool.startswith("warren"):
        relay = ["--relay"] if tool == "warren-relay" else []
        env = ctx["server"].env() | {"WARREN_LOG": "warn"}
        snd = Proc([ctx["warren"], "send", str(send_path), "--json"] + relay, wd, "send", env=env)
        try:
            t_code, m = snd.wait_line(r'"code":"([^"]+)"', 15)  # the code event
            res["code_s"] = t_code - snd.t0
            watcher = first_byte_watch(dst, stop, fb)
            rcv = Proc([ctx["warren"], "receive", "--out", str(dst), "--yes", "--json"] + relay, wd,
                       "recv", env=env | {"WARREN_CODE": m.group(1)}, prefix=recv_prefix)
            both_exit("warren", snd, rcv, stop, watcher)
        finally:
            snd.kill()
        res["wall_s"] = rcv.t_exit - rcv.t0
        events = {}
        for t, line in rcv.lines:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            events.setdefault(e.get("event"), (t, e))
        if "connected" not in events or "finished" not in events:
            raise Failed(f"warren receive printed no connected/finished event: {rcv.stdout()[-800:]}")
        res["route"] = events["connected"][1].get("route")
        want = "relayed" if tool == "warren-relay" else "direct"
        if res["route"] != want:
            raise Failed(f"{tool}: the transfer went {res['route']}, not {want}")
        res["connected_s"] = events["connected"][0] - rcv.t0
        if "started" in events:
            res["started_s"] = events["started"][0] - rcv.t0
        res["finished_s"] = events["finished"][0] - rcv.t0
        res["transfer_s"] = events["finished"][1].get("seconds")
        res["rss_send_mib"] = snd.rss_mib()
        res["rss_recv_mib"] = rcv.rss_mib()
    elif tool in ("scp", "scp-aes128gcm", "rsync"):
        sshd: Sshd = ctx["sshd"]
        remote = f"{sshd.user}@{sshd.host}:{send_path}"
        if tool == "rsync":
            argv = ["rsync", "-a", "-e", sshd.ssh_cmd(), remote, str(dst) + "/"]
        else:
            cipher = ["-c", "aes128-gcm@openssh.com"] if tool == "scp-aes128gcm" else []
            argv = ["scp", "-q", "-r", "-P", str(sshd.port)] + sshd.ssh_opts() + cipher + [remote, str(dst) + "/"]
        watcher = first_byte_watch(dst, stop, fb)
        rcv = Proc(argv, wd, "recv", prefix=recv_prefix)
        rc = rcv.wait(TIMEOUT)
        stop.set()
        watcher.join(2)
        if rc != 0:
            raise Failed(f"{tool} exited {rc}: {rcv.stderr()[-800:]}")
        res["wall_s"] = rcv.t_exit - rcv.t0
        res["rss_recv_mib"] = rcv.rss_mib()
    elif tool == "croc":
        croc, relay = ctx["croc"], ctx["croc_relay"]
        code = f"{secrets.randbelow(9000) + 1000}-{secrets.token_hex(4)}-{secrets.token_hex(4)}-bench"
        common = ["--yes", "--no-compress", "--disable-clipboard", "--overwrite"]
        home = {"HOME": str(wd / "croc-home")}
        snd = Proc([croc] + common + ["--relay", relay.addr, "send", "--no-local", str(send_path)],
                   wd, "send", env=home | {"CROC_SECRET": code})
        try:
            # croc hashes every file before it shows the code (stderr) and reaches the relay.
            deadline = time.monotonic() + TIMEOUT
            while "Code is:" not in snd.stderr():
                if snd.p.poll() is not None or time.monotonic() > deadline:
                    raise Failed(f"croc send showed no code: {snd.stderr()[-800:]}")
                time.sleep(0.005)
            res["code_s"] = time.monotonic() - snd.t0
            watcher = first_byte_watch(dst, stop, fb)
            # --ip: straight to the relay, no multicast discovery of local senders.
            rcv = Proc([croc] + common + ["--ip", relay.addr, "--out", str(dst)], wd, "recv",
                       env=home | {"CROC_SECRET": code}, prefix=recv_prefix)
            both_exit("croc", snd, rcv, stop, watcher)
        finally:
            snd.kill()
        res["wall_s"] = rcv.t_exit - rcv.t0
        res["rss_send_mib"] = snd.rss_mib()
        res["rss_recv_mib"] = rcv.rss_mib()
    elif tool == "sendme":
        sendme, ns = ctx["sendme"], ctx["netns"]
        scwd = wd / "sendme-send"
        scwd.mkdir(exist_ok=True)
        common = ["--relay", "disabled", "--no-progress"]
        snd = Proc([sendme, "send", str(send_path), "--ticket-type", "addresses"] + common, wd, "send",
                   cwd=scwd, prefix=ns.prefix)
        try:
            t_code, m = snd.wait_line(r"sendme receive (\S+)", TIMEOUT)
            res["code_s"] = t_code - snd.t0
            watcher = first_byte_watch(dst, stop, fb)
            rcv = Proc([sendme, "receive", m.group(1)] + common, wd, "recv", cwd=dst, prefix=ns.prefix)
            rc = rcv.wait(TIMEOUT)
            stop.set()
            watcher.join(2)
            if rc != 0:
                raise Failed(f"sendme receive exited {rc}: {rcv.stderr()[-800:]}")
            snd.interrupt()  # sendme send serves until Ctrl-C
            snd.wait(30)
        finally:
            snd.kill()
            shutil.rmtree(scwd, ignore_errors=True)
        res["wall_s"] = rcv.t_exit - rcv.t0
        res["rss_send_mib"] = snd.rss_mib()
        res["rss_recv_mib"] = rcv.rss_mib()
    else:
        raise Failed(f"unknown tool {tool}")
    # sendme downloads into its store (.sendme-recv-*, a database made at start) and
    # exports the files only at the end: no comparable first byte.
    if "t" in fb and tool != "sendme":
        res["first_byte_s"] = fb["t"] - rcv.t0
    return res


def output_root(tool: str, dst: Path, send_path: Path) -> Path:
    """Where the sent tree lands: every tool puts the sent file or folder by its name
    into the output folder."""
    return dst / send_path.name


# ---------------------------------------------------------------- run


def bench_home(args) -> Path:
    return Path(args.bench_home or os.environ.get("WARREN_BENCH_HOME")
                or Path.home() / ".cache/warren-bench")


def versions(ctx: dict, tools: list[str]) -> dict:
    v = {"warren": (B.sh([ctx["warren"], "--version"]).splitlines() or [""])[0].removeprefix("warren "),
         "warren commit": B.sh(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
         "python": sys.version.split()[0]}
    if any(t.startswith(("scp", "rsync")) for t in tools):
        v["openssh"] = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    if "rsync" in tools:
        v["rsync"] = " ".join((B.sh(["rsync", "--version"]).splitlines() or [""])[0].split()[1:4])
    if "croc" in tools:
        v["croc"] = B.sh([ctx["croc"], "--version"]).removeprefix("croc version ")
    if "sendme" in tools:
        v["sendme"] = B.sh([ctx["sendme"], "--version"]).removeprefix("sendme ")
    return v


def fs_info(path: Path) -> str:
    out = B.sh(["df", "-T", "-h", str(path)]).splitlines()
    if len(out) >= 2:
        f = out[1].split()
        return f"{f[1]} ({f[0]}, {f[4]} free at start)"
    return ""


def cmd_run(args) -> int:
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, B._on_signal)
    tools = args.only.split(",") if args.only else (["warren-direct", "warren-relay"] if args.smoke else TOOLS)
    for t in tools:
        if t not in TOOLS:
            log(f"unknown tool {t}; known: {', '.join(TOOLS)}")
            return 2
    if args.smoke:
        datasets = {"smoke": SMOKE_DATASET}
    else:
        names = args.datasets.split(",") if args.datasets else list(DATASETS)
        known = DATASETS | {"smoke": SMOKE_DATASET}
        datasets = {n: known[n] for n in names}
    skip10k = set(args.skip_10k.split(",")) if args.skip_10k else set()
    home = bench_home(args)
    warren = args.warren or str(REPO / "target/release/warren")
    base = Path(args.dir) if args.dir else None
    if base:
        base.mkdir(parents=True, exist_ok=True)
    import tempfile
    workdir = Path(tempfile.mkdtemp(prefix="warren-files-bench-", dir=base))
    ctx: dict = {"workdir": workdir, "warren": warren}
    netns = None
    started = time.time()
    doc = {
        "kind": "files", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": B.machine_info(), "runs": args.runs, "tools": tools,
        "datasets": {n: {"label": d[0], "files": len(d[1]), "bytes": sum(s for _, s in d[1])}
                     for n, d in datasets.items()},
        "skip_10k": sorted(skip10k), "filesystem": fs_info(workdir), "workdir": str(workdir),
        "loadavg": [], "results": {}, "errors": [],
    }
    try:
        if any(t.startswith("warren") for t in tools):
            ctx["server"] = WarrenServer(warren, workdir)
        if any(t.startswith(("scp", "rsync")) for t in tools):
            ctx["sshd"] = Sshd(workdir)
        if "croc" in tools:
            ctx["croc"] = B.tool("croc", home)
            (workdir / "croc-home").mkdir()
            ctx["croc_relay"] = CrocRelay(ctx["croc"], workdir)
        if "sendme" in tools:
            ctx["sendme"] = B.tool("sendme", home)
            netns = Netns()
            ctx["netns"] = netns
        doc["versions"] = versions(ctx, tools)
        log(f"making the data sets in {workdir} ({doc['filesystem']})")
        srcs, sums = {}, {}
        for n, (_label, files) in datasets.items():
            root = workdir / "src" / n
            t = time.monotonic()
            sums[n] = make_dataset(root, files)
            # One file: send the file itself; a tree: send its folder.
            srcs[n] = root / files[0][0] if len(files) == 1 else root
            log(f"  {n}: {len(files)} files in {time.monotonic() - t:.1f} s")
        os.sync()
        for run in range(args.runs):
            doc["loadavg"].append(round(B.loadavg(), 2))
            log(f"run {run + 1}/{args.runs} (load average {doc['loadavg'][-1]})")
            for n in datasets:
                for tool in tools:
                    if n == "10000x4KiB" and tool in skip10k:
                        continue
                    warm(workdir / "src" / n)
                    touch_free_memory(workdir, doc["datasets"][n]["bytes"] + 256 * MIB)
                    dst = workdir / "dst"
                    shutil.rmtree(dst, ignore_errors=True)
                    dst.mkdir()
                    send_path = srcs[n]
                    try:
                        r = run_one(tool, n, workdir / "src" / n, send_path, dst, ctx)
                        got = output_root(tool, dst, send_path)
                        if send_path.is_file():
                            verify_single(got, sums[n])
                        else:
                            verify(got, sums[n])
                        r["verified"] = True
                    except Failed as e:
                        r = {"error": str(e)[:2000]}
                        doc["errors"].append(f"run {run + 1}, {n}, {tool}: {str(e)[:500]}")
                        log(f"  {n} {tool}: FAILED: {str(e)[:500]}")
                    doc["results"].setdefault(n, {}).setdefault(tool, []).append(r)
                    if "wall_s" in r and "error" not in r:
                        extra = "".join(f" {k}={r[k]:.3f}" for k in ("code_s", "first_byte_s")
                                        if isinstance(r.get(k), float))
                        log(f"  {n} {tool}: {r['wall_s']:.2f} s{extra}")
                    # Outside the timed part: drop the output, and write back what the
                    # tools left dirty so the next transfer starts with no writeback.
                    shutil.rmtree(dst, ignore_errors=True)
                    os.sync()
        if "server" in ctx:
            doc["warren_server_hwm_mib"] = ctx["server"].hwm_mib()
    finally:
        B.PROCS.stop_all()
        if netns:
            netns.close()
        shutil.rmtree(workdir, ignore_errors=True)
    doc["minutes"] = round((time.time() - started) / 60, 1)
    text = render(doc)
    print(text)
    if not args.smoke and not args.no_json:
        out = HERE / "results" / f"files-{time.strftime('%Y-%m-%d-%H%M', time.gmtime(started))}.json"
        out.write_text(json.dumps(doc, indent=1) + "\n")
        log(f"wrote {out.relative_to(REPO)}")
        if args.write_results:
            write_results(doc)
    if doc["errors"]:
        log(f"{len(doc['errors'])} transfer(s) failed")
        return 1
    return 0


def verify_single(got: Path, sums: dict[str, str]) -> None:
    (rel, want), = sums.items()
    if not got.is_file():
        raise Failed(f"{got.name} missing from the output")
    if sha256_file(str(got)) != want:
        raise Failed(f"{got.name}: contents differ from the source")
    extra = [p for p in got.parent.iterdir() if p != got and not p.name.startswith(".sendme-")]
    if extra:
        raise Failed(f"unexpected entries in the output: {[p.name for p in extra][:5]}")


# ---------------------------------------------------------------- rendering


def med(runs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in runs if isinstance(r.get(key), (int, float)) and "error" not in r]
    return statistics.median(vals) if vals else None


def fmt(v, spec="{:.2f}") -> str:
    return "—" if v is None else spec.format(v)


def targets(doc: dict) -> list[tuple[str, str, bool | None]]:
    R = doc["results"]

    def m(ds, tool, key="wall_s"):
        return med(R.get(ds, {}).get(tool, []), key)

    out = []
    wd, wr = m("1GiB", "warren-direct"), m("1GiB", "warren-relay")
    sg = m("1GiB", "scp-aes128gcm")
    if wd and sg:
        out.append(("1 GiB: Warren direct ≥ scp aes128-gcm (time ≤)", f"Warren {wd:.2f} s vs scp aes-gcm {sg:.2f} s "
                    f"({sg / wd:.2f}× scp's speed)", wd <= sg))
    w1k, s1k = m("1000x1MiB", "warren-direct"), m("1000x1MiB", "scp")
    if w1k and s1k:
        out.append(("1000 × 1 MiB: Warren direct ≥ 1.5× scp (default)", f"Warren {w1k:.2f} s vs scp {s1k:.2f} s "
                    f"({s1k / w1k:.2f}×)", s1k / w1k >= 1.5))
    if w1k and wd:
        out.append(("1000-file tree within 1.2× of the 1 GiB time (Warren direct)",
                    f"{w1k:.2f} s vs {wd:.2f} s ({w1k / wd:.2f}×; the tree is 1000 MiB, 0.98 GiB)", w1k <= 1.2 * wd))
    for ds in doc["datasets"]:
        c = m(ds, "croc")
        for tool in ("warren-direct", "warren-relay"):
            w = m(ds, tool)
            if c and w:
                out.append((f"{ds}: {LABELS[tool]} ≥ 2× croc", f"{w:.2f} s vs croc {c:.2f} s ({c / w:.2f}×)",
                            c / w >= 2))
    codes = [(ds, tool, max(r["code_s"] for r in R[ds][tool] if "code_s" in r))
             for ds in R for tool in R[ds] if tool.startswith("warren") and any("code_s" in r for r in R[ds][tool])]
    if codes:
        worst = max(codes, key=lambda x: x[2])
        out.append(("code shown in ≤ 100 ms for any tree (worst single run)",
                    f"max {worst[2] * 1000:.0f} ms ({worst[0]}, {worst[1]}); medians "
                    + ", ".join(f"{ds} {med(R[ds][t], 'code_s') * 1000:.0f}" for ds, t, _ in codes if t == "warren-direct")
                    + " ms", worst[2] <= 0.1))
    fbs = [(ds, med(R[ds]["warren-direct"], "first_byte_s")) for ds in R if "warren-direct" in R[ds]]
    fbs = [(ds, v) for ds, v in fbs if v is not None]
    if fbs:
        worst = max(v for _, v in fbs)
        out.append(("code to first byte ≤ 300 ms direct (median per data set)",
                    ", ".join(f"{ds} {v * 1000:.0f} ms" for ds, v in fbs), worst <= 0.3))
    rss = []
    for ds in R:
        for tool in R[ds]:
            if tool.startswith("warren"):
                for k in ("rss_send_mib", "rss_recv_mib"):
                    vals = [r[k] for r in R[ds][tool] if isinstance(r.get(k), (int, float))]
                    if vals:
                        rss.append((max(vals), ds, tool, k))
    if rss:
        top = max(rss)
        out.append(("peak RSS ≤ 96 MiB per side (worst run)",
                    f"max {top[0]:.1f} MiB ({top[1]}, {top[2]}, {'sender' if 'send' in top[3] else 'receiver'})",
                    top[0] <= 96))
    return out


def tidy_version(name: str, val: str) -> str:
    val = re.sub(r"\s+", " ", str(val))
    for prefix in (f"{name} version ", f"{name} "):
        val = val.removeprefix(prefix)
    return val.removeprefix("version ")


def render(doc: dict, heading: str = "##") -> str:
    m = doc["machine"]
    v = doc.get("versions", {})
    lines = [f"{heading} File transfer (issue 17)", ""]
    if doc["runs"] == 1 and "smoke" in doc["datasets"]:
        lines[0] = f"{heading} File transfer smoke run"
    lines += [
        f"- Date: {doc['date']} ({doc.get('minutes', '?')} minutes)",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}, Linux {m['kernel']}",
        f"- Runs: {doc['runs']} (medians shown); 1-minute load average before each run: "
        + ", ".join(map(str, doc["loadavg"]))
        + (" — **noisy** (above 0.5): other work shared the two cores" if any(l > 0.5 for l in doc["loadavg"]) else ""),
        "- Versions: " + "; ".join(f"{k} {tidy_version(k, val)}" for k, val in v.items() if val),
        f"- Files: source and destination on {doc['filesystem']}. Sources are read once before every "
        "transfer (in the page cache); nothing is dropped from the cache; the destination is written "
        "through the page cache. Warren fsyncs each finished file before renaming it (its default, "
        "`SyncPolicy::Data`; no flag turns it off); scp, rsync, croc and sendme do not fsync. After each "
        "transfer (untimed) the output is hashed against the source, deleted, and `sync` runs, so every "
        "transfer starts with no dirty pages. Just before each transfer (untimed) the data set's size "
        "+ 256 MiB of zeros is written into a scratch file and deleted, so every tool's page cache comes "
        "from memory touched a moment ago (this VM hands free memory back to its host, and the first "
        "write into such memory is slow: see `touch_free_memory`).",
        "- Time: from the start of the receiving command to its exit (scp and rsync: the pulling "
        "client). Warren's \"code\" = from `warren send` to its `code` event; \"first byte\" = from the "
        "start of the receiving command until a file with data shows up in the output folder (polled "
        "every ~1 ms, temporary names included). MiB/s = data set bytes / median time.",
        "",
        "| tool | data set | median s | MiB/s | vs Warren direct (time) | code / ticket s | first byte s | peak RSS send / recv MiB | runs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    R = doc["results"]
    for ds, info in doc["datasets"].items():
        base = med(R.get(ds, {}).get("warren-direct", []), "wall_s")
        for tool in doc["tools"]:
            runs = R.get(ds, {}).get(tool)
            if not runs:
                continue
            ok = [r for r in runs if "error" not in r]
            w = med(runs, "wall_s")
            rate = info["bytes"] / MIB / w if w else None
            ratio = f"{w / base:.2f}×" if w and base else "—"
            rs = [r.get("rss_send_mib") for r in ok if r.get("rss_send_mib")]
            rr = [r.get("rss_recv_mib") for r in ok if r.get("rss_recv_mib")]
            rss = f"{max(rs):.0f}" if rs else "—"
            rss += f" / {max(rr):.0f}" if rr else " / —"
            c = med(runs, "code_s")
            lines.append(
                f"| {LABELS[tool]} | {info['label']} | {fmt(w)} | {fmt(rate, '{:.0f}')} | {ratio} | "
                f"{fmt(c, '{:.3f}')} | {fmt(med(runs, 'first_byte_s'), '{:.3f}')} | {rss} | "
                f"{len(ok)}/{len(runs)} |")
    lines.append("")
    lines.append("Peak RSS is the maximum over the runs (GNU time `%M`); for scp and rsync only the local "
                 "(receiving) client is measured. Ratio > 1 means slower than Warren direct.")
    extra = []
    for ds in R:
        for tool in ("warren-direct", "warren-relay"):
            runs = [r for r in R[ds].get(tool, []) if "error" not in r]
            if runs:
                extra.append(f"| {LABELS[tool]} | {doc['datasets'][ds]['label']} | "
                             f"{fmt(med(runs, 'connected_s'), '{:.3f}')} | {fmt(med(runs, 'started_s'), '{:.3f}')} | "
                             f"{fmt(med(runs, 'finished_s'), '{:.2f}')} | {fmt(med(runs, 'wall_s'), '{:.2f}')} | "
                             f"{', '.join(fmt(r.get('wall_s')) for r in runs)} |")
    if extra:
        lines += ["", "Warren's receiver in detail (medians, seconds from the start of `warren receive`; "
                  "`finished` is its JSON event, exit is the process exit):", "",
                  "| tool | data set | connected | started | finished | exit | every run (exit) |",
                  "|---|---|---|---|---|---|---|"] + extra
    if doc.get("warren_server_hwm_mib"):
        lines += ["", f"The Warren server (mailbox, reflector and relay) peaked at "
                  f"{doc['warren_server_hwm_mib']:.1f} MiB RSS over the whole run (`VmHWM`)."]
    if doc.get("skip_10k"):
        lines += ["", f"Left out of the 10 000 × 4 KiB set to keep the run short: {', '.join(doc['skip_10k'])}."]
    t = targets(doc)
    if t:
        lines += ["", f"{heading}# Targets (issue 17)", "", "| target | measured | met? |", "|---|---|---|"]
        for name, what, ok in t:
            lines.append(f"| {name} | {what} | {'yes' if ok else '**no**'} |")
    if doc["errors"]:
        lines += ["", "Failed transfers:", ""] + [f"- {e}" for e in doc["errors"]]
    return "\n".join(lines) + "\n"


def readme_rows(doc: dict) -> str:
    R = doc["results"]
    lines = [README_START, "",
             f"Measured by `bench/run.sh --files` on {doc['date']} ({doc['machine']['cores']}-core "
             f"{doc['machine']['cpu']}, loopback, medians of {doc['runs']}; method, every tool and the "
             "targets: [bench/RESULTS.md](bench/RESULTS.md#file-transfer-issue-17)). Seconds from "
             "the receiving command's start to its exit; lower is better. Warren fsyncs every "
             "received file, the others do not; sources in the page cache, destination on "
             f"{doc['filesystem'].split(' (')[0]}"
             + ("; a shared, busy machine (load average "
                + "–".join(f"{l:.1f}" for l in (min(doc['loadavg']), max(doc['loadavg']))) + "), so expect ±20 %"
                if any(l > 0.5 for l in doc["loadavg"]) else "")
             + ("; — = not run" if doc.get("skip_10k") else "") + ":", "",
             "| data set | " + " | ".join(LABELS[t] for t in doc["tools"]) + " |",
             "|---|" + "---|" * len(doc["tools"])]
    for ds, info in doc["datasets"].items():
        lines.append(f"| {info['label']} | " + " | ".join(fmt(med(R.get(ds, {}).get(t, []), "wall_s"))
                                                        for t in doc["tools"]) + " |")
    lines += ["", README_END]
    return "\n".join(lines)


def write_results(doc: dict) -> None:
    B.replace_section(SECTION, render(doc, "##"))
    log("wrote bench/RESULTS.md's section \"File transfer (issue 17)\"")
    readme = REPO / "README.md"
    t = readme.read_text()
    a, b = t.find(README_START), t.find(README_END)
    if a >= 0 and b > a:
        readme.write_text(t[:a] + readme_rows(doc) + t[b + len(README_END):])
        log("wrote README.md's file-transfer rows")
    else:
        log("README.md has no files-bench markers; not touched")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--smoke", action="store_true", help="Warren only, one small tree, 1 run, writes nothing")
    r.add_argument("--only", help=f"comma-separated tools ({','.join(TOOLS)})")
    r.add_argument("--datasets", help=f"comma-separated data sets ({','.join(DATASETS)})")
    r.add_argument("--skip-10k", default="", help="tools left out of the 10000x4KiB set")
    r.add_argument("--dir", help="where the data sets and outputs go (default: $TMPDIR)")
    r.add_argument("--warren", help="the warren binary (default target/release/warren)")
    r.add_argument("--bench-home", help="where the peers are installed")
    r.add_argument("--write-results", action="store_true")
    r.add_argument("--no-json", action="store_true", help="write no bench/results/files-DATE.json")
    p = sub.add_parser("render")
    p.add_argument("json")
    p.add_argument("--write-results", action="store_true")
    args = ap.parse_args()
    if args.cmd == "render":
        doc = json.loads(Path(args.json).read_text())
        print(render(doc))
        if args.write_results:
            write_results(doc)
        return 0
    if args.smoke:
        args.runs = 1
    return cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
