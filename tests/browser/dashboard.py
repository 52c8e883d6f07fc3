#!/usr/bin/env python3
"""The dashboard in a real browser, against the real binary (issue 16's Done-when).

Starts `warren server` and `warren client` (release binary, configs in a temp dir, every
listener on 127.0.0.1, `[admin]` with a token on both sides) around two services: `bulk`,
a TCP service whose target is a sink that hashes what it receives, and `app`, an HTTP
service whose backend records every request. Then headless Chromium (Debian's, driven by
Playwright) goes through the dashboard as a person would:

  login (a wrong token refused, the right one let in) -> services listed -> 200 MB through
  `bulk` while the byte counters and the graph move (hash checked at the far end) -> a
  request with a hostile header found in the inspector and shown as text -> replay and
  edit-and-replay arriving at the backend -> a config with an error refused by Reload,
  with its line -> a session disconnected and the client back -> the server restarted and
  the page live again by itself.

It fails on any JS error or CSP violation, on any request that leaves 127.0.0.1, and when
the assets pass 150 KB. It prints the first-load time (navigation timing) and the server's
CPU over 30 s with one dashboard open, and saves screenshots of every page at desktop and
phone width in target/dashboard-screenshots/. Every process it starts is killed by PID at
the end; every wait has a timeout. Usage: tests/browser/README.md.
"""

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from playwright.sync_api import sync_playwright

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WARREN = os.environ.get("WARREN_BIN", os.path.join(ROOT, "target", "release", "warren"))
SHOTS = os.path.join(ROOT, "target", "dashboard-screenshots")
UI = os.path.join(ROOT, "crates", "warren", "src", "admin", "ui")
ASSETS = ["app.js", "app.css", "uplot.min.js", "uplot.min.css", "favicon.svg"]
PSK = "browser-psk-0123456789-abcdefghij"
TOKEN = "browser-token-0123456789-abcdefg"
ADMIN_TOKEN = "admin-token-0123456789-abcdefgh"
EVIL = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=1\">"
TRANSFER_BYTES = 200 * 1024 * 1024
TRANSFER_SECONDS = 5.0
WAIT_MS = 10_000  # Playwright's timeout for any one wait
DEADLINE_S = 240  # the whole run, whatever happens (it takes about a minute and a half)
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wait_for(what, check, timeout=10.0, every=0.1):
    """Polls `check()` until it returns something truthy; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def free_port():
    """A loopback port free for TCP and UDP a moment ago, below the ephemeral range (as
    the Rust e2e tests pick them), so no outgoing connection takes it before warren binds."""
    import random

    for _ in range(200):
        port = random.randint(10_000, 19_999)
        try:
            with socket.socket() as t, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                t.bind(("127.0.0.1", port))
                u.bind(("127.0.0.1", port))
                return port
        except OSError:
            continue
    raise RuntimeError("no free port")


# ------------------------------------------------------------------------------ targets


class Sink:
    """The `bulk` service's target: hashes every byte a connection sends, then answers the
    hex digest and closes. Keeps (bytes, digest) per finished connection."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.done = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        digest, total = hashlib.sha256(), 0
        with conn:
            try:
                while chunk := conn.recv(1 << 20):
                    digest.update(chunk)
                    total += len(chunk)
                conn.sendall(digest.hexdigest().encode())
            except OSError:
                return
        self.done.append((total, digest.hexdigest()))


class Backend:
    """The `app` service's backend: answers JSON and records every request it gets."""

    def __init__(self):
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                seen.append({"method": self.command, "path": self.path,
                             "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                out = json.dumps({"ok": True, "seen": len(seen), "path": self.path}).encode()
                # A few paths fail, so the inspector has every colour of status to show.
                self.send_response(404 if self.path.startswith("/missing") else 500 if self.path.startswith("/boom") else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # Warren's pooled keep-alive connections are cut when it stops: not worth a traceback.
        self.server.handle_error = lambda request, address: None
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def send_paced(port, total, seconds, result):
    """Sends `total` random bytes to 127.0.0.1:port over about `seconds`, half-closes, and
    reads the sink's digest back. Fills `result` with sent/digest/answer."""
    digest = hashlib.sha256()
    chunk = 1 << 20
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        sent = 0
        while sent < total:
            block = os.urandom(min(chunk, total - sent))
            s.sendall(block)
            digest.update(block)
            sent += len(block)
            ahead = start + seconds * sent / total - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while part := s.recv(256):
            answer += part
    result.update(sent=sent, digest=digest.hexdigest(), answer=answer.decode(), seconds=time.monotonic() - start)


# ------------------------------------------------------------------------------ processes


class Warren:
    """One `warren` child process; output in the temp dir; killed by PID in stop()."""

    def __init__(self, workdir, name, args):
        self.workdir, self.name, self.args, self.proc, self.runs = workdir, name, args, None, 0

    def start(self):
        self.runs += 1
        out = open(os.path.join(self.workdir, f"{self.name}.{self.runs}.log"), "wb")
        env = dict(os.environ, WARREN_PSK=PSK, NO_COLOR="1")
        self.proc = subprocess.Popen([WARREN, *self.args], cwd=self.workdir, env=env,
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        return self

    @property
    def pid(self):
        return self.proc.pid

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def tail(self, lines=30):
        path = os.path.join(self.workdir, f"{self.name}.{self.runs}.log")
        try:
            with open(path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def admin_get(port, path):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=5) as res:
        return json.loads(res.read())


def admin_try(port, path):
    try:
        return admin_get(port, path)
    except (OSError, urllib.error.URLError, ValueError):
        return None


class CpuMeter:
    """CPU a process spends from now until `seconds()`: the larger of two readings.
    /proc/PID/stat's utime + stime (fields 14 and 15) counts every thread, also those that
    exit meanwhile, but in clock ticks of 10 ms, so an idle server reads 0; each thread's
    /proc/PID/task/TID/schedstat counts nanoseconds, but a thread that exits takes its share
    with it (tokio's blocking threads come and go)."""

    def __init__(self, pid):
        self.pid = pid
        self.ticks0, self.threads0 = self._ticks(), self._threads()

    def _ticks(self):
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _threads(self):
        ran = {}
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                with open(f"/proc/{self.pid}/task/{tid}/schedstat") as f:
                    ran[tid] = int(f.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                pass
        return ran

    def seconds(self):
        threads = self._threads()
        by_thread = sum(t - self.threads0.get(tid, 0.0) for tid, t in threads.items())
        return max(self._ticks() - self.ticks0, by_thread)


# ------------------------------------------------------------------------------ the run


class Run:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="warren-browser-")
        self.ports = {k: free_port() for k in ("server", "http", "bulk", "admin", "client_admin")}
        self.sink, self.backend = Sink(), Backend()
        self.passed, self.js_errors, self.net_errors, self.outside = [], [], [], []
        self.allow_net_errors = False
        self.base = f"http://127.0.0.1:{self.ports['admin']}"
        self.server_toml = os.path.join(self.dir, "server.toml")
        self.client_toml = os.path.join(self.dir, "client.toml")
        self.server_text = self._server_config()
        with open(self.server_toml, "w") as f:
            f.write(self.server_text)
        with open(self.client_toml, "w") as f:
            f.write(self._client_config())
        self.server = Warren(self.dir, "server", ["server", self.server_toml])
        self.client = Warren(self.dir, "client", ["client", self.client_toml])

    def _server_config(self):
        p = self.ports
        return f"""[server]
bind = "127.0.0.1:{p['server']}"
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"

[server.http]
bind = "127.0.0.1:{p['http']}"

[server.services.bulk]
bind = "127.0.0.1:{p['bulk']}"

[server.services.app]
type = "http"
hosts = ["app.test"]
capture_body_bytes = 4096

[[server.services.app.middleware]]
type = "ip_allow"
cidrs = ["127.0.0.0/8"]

[admin]
bind = "127.0.0.1:{p['admin']}"
token = "{ADMIN_TOKEN}"
"""

    def _client_config(self):
        p = self.ports
        return f"""[client]
server = "127.0.0.1:{p['server']}"
psk = "${{WARREN_PSK}}"
default_token = "{TOKEN}"
reconnect_initial_delay = "200ms"
reconnect_max_delay = "1s"

[client.services.bulk]
target = "127.0.0.1:{self.sink.port}"

[client.services.app]
type = "http"
target = "127.0.0.1:{self.backend.port}"

[admin]
bind = "127.0.0.1:{p['client_admin']}"
token = "{ADMIN_TOKEN}"
"""

    def step(self, name):
        self.passed.append(name)
        log(f"ok   {name}")

    # -------------------------------------------------------------- helpers on the page

    def watch(self, page):
        """Fails the run on JS errors and CSP violations; notes requests leaving 127.0.0.1."""

        def on_console(msg):
            if msg.type != "error":
                return
            if msg.text.startswith("Failed to load resource") or "net::ERR_" in msg.text:
                # The browser's own line for a non-2xx answer or a refused connection (a
                # 422 from Reload, the event stream while the server restarts): not a JS
                # error; kept to print, and fatal outside the restart.
                self.net_errors.append(msg.text)
                if "net::ERR_" in msg.text and not self.allow_net_errors:
                    self.js_errors.append("network error outside the restart: " + msg.text)
                return
            self.js_errors.append(f"console.error: {msg.text}")

        page.on("console", on_console)
        page.on("pageerror", lambda err: self.js_errors.append(f"pageerror: {err}"))
        page.on("request", lambda req: None if req.url.startswith(("http://127.0.0.1:", "data:")) else self.outside.append(req.url))
        # Every CSP violation also fires this DOM event; collect them on the page itself
        # (an init script is injected by the browser, not subject to the page's CSP).
        page.add_init_script("""
            window.__csp = [];
            document.addEventListener('securitypolicyviolation',
                (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI + ' ' + (e.sourceFile || '') + ':' + e.lineNumber));
        """)

    def check_clean(self, page, where):
        csp = page.evaluate("window.__csp || []")
        assert not csp, f"CSP violations on {where}: {csp}"
        assert not self.js_errors, f"JS errors on {where}: {self.js_errors}"
        assert not self.outside, f"requests left 127.0.0.1 on {where}: {self.outside}"

    @staticmethod
    def go(page, route):
        """Hash navigation: the same document, so the graphs keep their history."""
        page.evaluate("(h) => { location.hash = h; }", route)
        page.wait_for_function("(h) => location.hash === h", arg=route)

    @staticmethod
    def card(page, key):
        value = page.get_attribute(f".card[data-k='{key}']", "data-value", timeout=WAIT_MS)
        return float(value) if value not in (None, "") else 0.0

    def shoot(self, page, name):
        for label, size in (("desktop", DESKTOP), ("phone", PHONE)):
            page.set_viewport_size(size)
            page.wait_for_timeout(350)  # the graphs follow their box's new width
            page.screenshot(path=os.path.join(SHOTS, f"{label}-{name}.png"))
        page.set_viewport_size(DESKTOP)

    # -------------------------------------------------------------- the scenario

    def run(self):
        os.makedirs(SHOTS, exist_ok=True)
        assert os.access(WARREN, os.X_OK), f"no binary at {WARREN}: cargo build --release -p warren"
        self.server.start()
        self.client.start()

        def serving():
            services = admin_try(self.ports["admin"], "/api/v1/services") or []
            return {s["name"]: s["state"] for s in services} == {"bulk": "serving", "app": "serving"}

        wait_for("both services serving", serving, timeout=15)
        self.step("server and client up, both services serving")

        self.check_assets()

        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        assert chromium, "no chromium: apt-get install -y chromium"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium)
            try:
                self.browse(browser)
            finally:
                browser.close()

    def check_assets(self):
        sizes = {name: os.path.getsize(os.path.join(UI, name)) for name in ["index.html", "login.html", *ASSETS]}
        total = sum(sizes.values())
        log("assets: " + ", ".join(f"{k} {v:,} B" for k, v in sizes.items()) + f"; total {total:,} B")
        self.asset_total = total
        assert total <= 150 * 1024, f"the dashboard's assets weigh {total} B, over 150 KB"
        # What the binary serves is what the files hold, with the CSP on the page.
        for name in ASSETS:
            with urllib.request.urlopen(f"{self.base}/assets/{name}", timeout=5) as res:
                assert res.read() == open(os.path.join(UI, name), "rb").read(), f"/assets/{name} differs from {name}"
        req = urllib.request.Request(self.base + "/login")
        with urllib.request.urlopen(req, timeout=5) as res:
            csp = res.headers.get("Content-Security-Policy", "")
        assert "default-src 'none'" in csp and "script-src 'self'" in csp, f"no strict CSP on /login: {csp!r}"
        self.step(f"assets served as built ({total:,} B, under 150 KB) with a strict CSP")

    def browse(self, browser):
        ctx = browser.new_context(viewport=DESKTOP)
        ctx.set_default_timeout(WAIT_MS)
        page = ctx.new_page()
        self.watch(page)

        # --- login: refused with a wrong token, let in with the right one
        page.goto(self.base + "/")
        page.wait_for_url(re.compile(r"/login$"))
        page.fill("input[name=token]", "not-the-token-at-all")
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r"/login\?failed"))
        page.wait_for_selector("#failed", state="visible")
        self.step("a wrong token is refused (login page says so)")
        page.fill("input[name=token]", ADMIN_TOKEN)
        page.click("button[type=submit]")
        page.wait_for_url(self.base + "/")
        page.wait_for_selector("#live[data-state=live]")
        cookie = next(c for c in ctx.cookies() if c["name"] == "warren_admin")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie
        self.step("the right token logs in (HttpOnly SameSite=Strict cookie), the stream is live")

        # --- first load, cold (cache off), measured by the browser's navigation timing
        cdp = ctx.new_cdp_session(page)
        cdp.send("Network.enable")
        cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
        t0 = time.monotonic()
        page.reload()  # a real navigation (a goto that changes only the hash would not be)
        page.wait_for_selector(".card[data-k='sessions'][data-value]")
        first_data_ms = (time.monotonic() - t0) * 1000
        nav = page.evaluate("""() => { const n = performance.getEntriesByType('navigation')[0];
            return {dcl: n.domContentLoadedEventEnd, load: n.loadEventEnd, bytes: performance.getEntriesByType('resource').reduce((a, r) => a + (r.transferSize || 0), n.transferSize || 0)}; }""")
        cdp.send("Network.setCacheDisabled", {"cacheDisabled": False})
        self.first_load = nav["load"]
        log(f"first load (cold cache): DOMContentLoaded {nav['dcl']:.0f} ms, load {nav['load']:.0f} ms, "
            f"{nav['bytes']:,} B transferred; first live numbers on screen after {first_data_ms:.0f} ms")
        assert nav["load"] < 1500, f"first load took {nav['load']:.0f} ms"
        self.step(f"first load {nav['load']:.0f} ms (target 300 ms)")
        self.check_clean(page, "overview")

        # --- the services are listed
        self.go(page, "#/services")
        page.wait_for_selector("tr[data-service=bulk]")
        page.wait_for_selector("tr[data-service=app]")
        assert "http" in page.inner_text("tr[data-service=app]")
        self.step("Services lists bulk (tcp) and app (http)")

        # --- 200 MB through bulk: the counters and the graph move
        self.go(page, "#/overview")
        page.wait_for_selector("#chart-traffic[data-n]")
        before_in = self.card(page, "in")
        before_n = int(page.get_attribute("#chart-traffic", "data-n"))
        result = {}
        sender = threading.Thread(target=send_paced, args=(self.ports["bulk"], TRANSFER_BYTES, TRANSFER_SECONDS, result), daemon=True)
        sender.start()
        page.wait_for_timeout(2000)
        mid_in = self.card(page, "in")
        page.wait_for_timeout(1500)
        later_in = self.card(page, "in")
        page.screenshot(path=os.path.join(SHOTS, "desktop-overview-transfer.png"))  # the README's picture
        assert before_in < mid_in < later_in, f"the in counter did not grow: {before_in} {mid_in} {later_in}"
        graph_max = float(page.get_attribute("#chart-traffic", "data-max"))
        graph_n = int(page.get_attribute("#chart-traffic", "data-n"))
        assert graph_n > before_n and graph_max > 1e6, f"the graph did not move: {before_n}->{graph_n} points, max {graph_max}"
        self.go(page, "#/services")
        b1 = float(page.get_attribute("tr[data-service=bulk] td[data-k=bytes_in]", "data-value"))
        page.wait_for_timeout(1200)
        b2 = float(page.get_attribute("tr[data-service=bulk] td[data-k=bytes_in]", "data-value"))
        sender.join(timeout=30)
        assert not sender.is_alive(), "the transfer did not finish within 30 s"
        assert result["answer"] == result["digest"], "the sink's hash differs from what was sent"
        wait_for("the sink's record", lambda: (TRANSFER_BYTES, result["digest"]) in self.sink.done, timeout=5)
        assert b2 > b1, f"bulk's bytes_in did not grow on Services: {b1} -> {b2}"
        self.go(page, "#/overview")
        page.wait_for_timeout(1200)
        total_in = self.card(page, "in")
        assert total_in >= TRANSFER_BYTES, f"Overview counts {total_in} B in after {TRANSFER_BYTES} B"
        self.step(f"200 MB through bulk in {result['seconds']:.1f} s, hash checked; counters and graph moved "
                  f"(graph peak {graph_max / 1e6:.0f} MB/s)")

        # --- a hostile header, found in the inspector and shown as text
        http = self.ports["http"]
        curl = subprocess.run(["curl", "-sS", "--max-time", "10", "--resolve", f"app.test:{http}:127.0.0.1",
                               "-H", f"X-Test: {EVIL}", f"http://app.test:{http}/hello/world?from=curl"],
                              capture_output=True, text=True, timeout=20)
        assert curl.returncode == 0 and '"ok": true' in curl.stdout, f"curl through app failed: {curl.stderr} {curl.stdout}"
        # More traffic of other kinds: a JSON POST (its body is captured), a 404, a 500.
        for args in (["-X", "POST", "-H", "Content-Type: application/json", "--data-binary", '{"name":"warren","tags":["a","b"],"n":1}',
                      f"http://app.test:{http}/api/items"],
                     [f"http://app.test:{http}/missing/page"], [f"http://app.test:{http}/boom?retry=1"]):
            subprocess.run(["curl", "-sS", "-o", "/dev/null", "--max-time", "10", "--resolve", f"app.test:{http}:127.0.0.1", *args],
                           check=True, timeout=20)
        self.go(page, "#/requests")
        post = page.wait_for_selector("tr[data-id]:has(td.path:text-is('/api/items'))")
        post.click()
        body = page.wait_for_selector(".detail [data-body=request] pre")
        assert '\n  "tags": [' in body.text_content(), f"the JSON body is not pretty-printed: {body.text_content()!r}"
        page.wait_for_selector("tr[data-id]:has(td.s5)")
        page.wait_for_selector("tr[data-id]:has(td.s4)")
        row = page.wait_for_selector("tr[data-id]:has(td.path:text-is('/hello/world?from=curl'))")
        rid = int(row.get_attribute("data-id"))
        row.click()
        page.wait_for_function("(id) => location.hash === '#/requests/' + id", arg=rid)
        cell = page.wait_for_selector(".detail table.hdrs tr:has(td:text-is('x-test')) td:nth-child(2)")
        assert cell.text_content() == EVIL, f"the header shows as {cell.text_content()!r}"
        pwned = page.evaluate("""() => ({
            pwned: typeof window.__pwned,
            scripts: Array.from(document.scripts).map((s) => s.getAttribute('src')),
            imgs: Array.from(document.images).map((i) => i.getAttribute('src')),
        })""")
        assert pwned["pwned"] == "undefined", "window.__pwned was set: captured data ran as code"
        assert pwned["scripts"] == ["/assets/uplot.min.js", "/assets/app.js"], f"unexpected scripts: {pwned['scripts']}"
        assert all(src == "/assets/favicon.svg" for src in pwned["imgs"]), f"unexpected images: {pwned['imgs']}"
        self.check_clean(page, "request detail")
        self.step(f"request #{rid} in the inspector; the hostile header is literal text, nothing ran; a JSON body pretty-printed")

        # --- keyboard: Esc back to the list, j/k to move, Enter to open
        page.keyboard.press("Escape")
        page.wait_for_function("location.hash === '#/requests'")
        page.locator("main h1").click()  # focus on the page, not on an input
        page.keyboard.press("j")
        page.keyboard.press("j")
        page.keyboard.press("k")
        first = page.get_attribute("tr.sel", "data-id")
        page.keyboard.press("Enter")
        page.wait_for_function("(id) => location.hash === '#/requests/' + id", arg=first)
        self.step("keyboard: Esc, j/k and Enter move through the list and open a request")

        # --- replay: arrives at the backend and in the list
        self.go(page, f"#/requests/{rid}")
        page.wait_for_selector(".detail .reqline")
        seen = len(self.backend.seen)
        page.click(".detail button:text-is('Replay')")
        replayed = page.wait_for_selector(".detail .replayed[data-new-id]")
        new_id = int(replayed.get_attribute("data-new-id"))
        wait_for("the replay at the backend", lambda: len(self.backend.seen) > seen, timeout=5)
        assert self.backend.seen[-1]["path"] == "/hello/world?from=curl"
        assert self.backend.seen[-1]["headers"].get("x-test") == EVIL
        page.wait_for_selector(f"tr[data-id='{new_id}']")
        self.step(f"Replay: #{new_id} reached the backend and the list")

        # --- edit and replay with a changed header
        page.click(".detail button:text-is('Edit and replay')")
        area = page.locator(".detail textarea[name=headers]")
        area.fill(re.sub(r"(?im)^x-test:.*$", "x-test: edited-by-the-browser-test", area.input_value()))
        seen = len(self.backend.seen)
        page.click(".detail button:text-is('Send')")
        edited = page.wait_for_selector(".detail .replayed[data-new-id]")
        wait_for("the edited replay at the backend", lambda: len(self.backend.seen) > seen, timeout=5)
        got = self.backend.seen[-1]["headers"].get("x-test")
        assert got == "edited-by-the-browser-test", f"the backend got x-test {got!r}"
        edited_id = int(edited.get_attribute("data-new-id"))
        page.wait_for_selector(f"tr[data-id='{edited_id}']")
        self.step(f"Edit and replay: #{edited_id} reached the backend with the changed header")

        # --- copy as curl shows a command that names the request
        page.click(".detail button:text-is('Copy as curl')")
        curl_text = page.wait_for_selector(".detail pre.curl").text_content()
        assert curl_text.startswith("curl ") and "app.test" in curl_text, curl_text

        # --- the client's dashboard: its side, and no inspector (a friendly word, no error)
        self.client_side(browser)

        # --- screenshots of every page, desktop and phone. Two visitors stay open for the
        # Connections page, each past its first 100 KiB (the server lists a visitor once its
        # stream is committed: after the target's first byte, or 64 KiB with no answer).
        idle = [socket.create_connection(("127.0.0.1", self.ports["bulk"]), timeout=5) for _ in range(2)]
        for s in idle:
            s.sendall(os.urandom(100 * 1024))
        try:
            for name, route, ready in [
                ("overview", "#/overview", "#chart-traffic[data-n]"),
                ("services", "#/services", "tr[data-service=bulk]"),
                ("service-app", "#/services/app", "#chart-service"),
                ("sessions", "#/sessions", "tr[data-session]"),
                ("connections", "#/connections", "tr[data-key]"),
                ("requests", "#/requests", "tr[data-id]"),
                ("request", f"#/requests/{rid}", ".detail .reqline"),
                ("config", "#/config", "ol.code li"),
                ("logs", "#/logs", "main h1"),
            ]:
                self.go(page, route)
                page.wait_for_selector(ready)
                page.wait_for_timeout(300)
                self.shoot(page, name)
        finally:
            for s in idle:
                s.close()
        self.check_clean(page, "every page")
        self.step(f"screenshots of 9 pages at 1280x800 and 390x844 in {os.path.relpath(SHOTS, ROOT)}/")

        # --- a config with an error: Reload refuses it and names the line
        self.go(page, "#/config")
        page.wait_for_selector("ol.code li")
        broken = self.server_text + '\n[server.services.bulk2]\nbind = "127.0.0.1:1"\nbnd_typo = "x"\n'
        bad_line = broken.count("\n") - 0  # the last line, `bnd_typo = "x"`
        with open(self.server_toml, "w") as f:
            f.write(broken)
        page.click("#reload")
        refused = page.wait_for_selector("[data-outcome=refused]")
        lines = [li.get_attribute("data-line") for li in refused.query_selector_all("ul.errors li")]
        text_ = refused.inner_text()
        assert str(bad_line) in lines and f"line {bad_line}" in text_, f"no error on line {bad_line}: {lines} {text_!r}"
        with open(self.server_toml, "w") as f:
            f.write(self.server_text)
        page.click("#reload")
        page.wait_for_selector("[data-outcome=applied]")
        self.step(f"Reload refuses a broken config and shows the error on line {bad_line}; the fixed one reloads")

        # --- disconnect the client's session; it comes back
        self.go(page, "#/sessions")
        row = page.wait_for_selector("tr[data-session]")
        old = row.get_attribute("data-session")
        page.click(f"tr[data-session='{old}'] button.danger")
        page.click(f"tr[data-session='{old}'] button.armed")
        page.wait_for_selector(f"tr[data-session='{old}']", state="detached", timeout=15_000)
        back = page.wait_for_selector(f"tr[data-session]:not([data-session='{old}'])", timeout=15_000)
        self.step(f"session {old} disconnected from the Sessions page; the client came back as {back.get_attribute('data-session')}")

        # --- restart the server: the page reconnects by itself
        self.go(page, "#/overview")
        page.wait_for_selector("#live[data-state=live]")
        started = page.evaluate("fetch('/api/v1/status').then((r) => r.json()).then((s) => s.started)")
        self.allow_net_errors = True
        self.server.stop()
        page.wait_for_selector("#live:not([data-state=live])", timeout=8_000)
        time.sleep(1.1)  # a new `started` second, so the page can tell a new process
        self.server.start()
        page.wait_for_function("() => location.pathname === '/login' || document.querySelector('#live[data-state=live]')",
                               timeout=20_000)
        assert not page.url.split("?")[0].endswith("/login"), (
            "after the restart the login cookie got 401 and the page went to /login: the server must "
            "keep dashboard logins valid across a restart")
        wait_for("the client back after the restart",
                 lambda: (admin_try(self.ports["admin"], "/api/v1/sessions") or []) != [], timeout=15)
        self.allow_net_errors = False
        now_started = page.evaluate("fetch('/api/v1/status').then((r) => r.json()).then((s) => s.started)")
        assert now_started != started
        assert page.url.startswith(self.base + "/") and "/login" not in page.url, f"the page left for {page.url}"
        # The new process counts from zero: the card shows its numbers, then they grow.
        wait_for("the new process's counters on the page", lambda: self.card(page, "in") < TRANSFER_BYTES, timeout=5)
        result = {}
        send_paced(self.ports["bulk"], 8 * 1024 * 1024, 1.5, result)
        assert result["answer"] == result["digest"]
        wait_for("the in counter after the restart", lambda: self.card(page, "in") >= 8 * 1024 * 1024, timeout=5)
        self.check_clean(page, "after the restart")
        self.step("server restarted: the page reconnected by itself and its numbers move again")

        # --- the server's CPU with one dashboard open, idle, for 30 s
        n0 = int(page.get_attribute("#chart-traffic", "data-n"))
        meter, t0 = CpuMeter(self.server.pid), time.monotonic()
        page.wait_for_timeout(30_000)
        cpu_s, t1 = meter.seconds(), time.monotonic()
        n1 = int(page.get_attribute("#chart-traffic", "data-n"))
        self.cpu = cpu_s / (t1 - t0) * 100
        log(f"server CPU with one dashboard open: {cpu_s * 1000:.1f} ms in {t1 - t0:.0f} s = {self.cpu:.2f} % of a core "
            f"(target 1 %); the page drew {n1 - n0} ticks meanwhile")
        assert n1 - n0 >= 25 or n1 == 300, f"the page got {n1 - n0} ticks in 30 s"
        assert self.cpu < 5, f"the server used {self.cpu:.1f} % of a core"
        self.check_clean(page, "the end")
        self.step(f"server CPU {self.cpu:.2f} % of a core with the dashboard open")

        # --- log out: the cookie is gone and the dashboard asks for the token again
        if page.is_hidden("#logout button"):
            page.click("#menu")
        page.click("#logout button")
        page.wait_for_url(re.compile(r"/login$"))
        page.goto(self.base + "/")
        page.wait_for_url(re.compile(r"/login$"))
        self.check_clean(page, "logout")
        self.step("Log out ends the login")
        ctx.close()

    def client_side(self, browser):
        ctx = browser.new_context(viewport=DESKTOP)
        ctx.set_default_timeout(WAIT_MS)
        page = ctx.new_page()
        self.watch(page)
        base = f"http://127.0.0.1:{self.ports['client_admin']}"
        page.goto(base + "/login")
        page.fill("input[name=token]", ADMIN_TOKEN)
        page.click("button[type=submit]")
        page.wait_for_url(base + "/")
        page.wait_for_selector("#live[data-state=live]")
        assert "client" in page.inner_text("#side")
        self.go(page, "#/services")
        page.wait_for_selector("tr[data-service=bulk]")
        self.go(page, "#/requests")
        page.wait_for_selector("text=No request inspector here")
        self.shoot(page, "client-requests")
        self.check_clean(page, "the client's dashboard")
        ctx.close()
        self.step("the client's dashboard shows its side and services, and says it has no inspector")

    def cleanup(self, failed):
        for proc in (self.client, self.server):
            proc.stop()
        self.backend.server.shutdown()
        self.sink.sock.close()
        if failed:
            for proc in (self.server, self.client):
                log(f"--- {proc.name} log (last lines) ---\n{proc.tail()}")
            log(f"files kept in {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def main():
    # A hard stop for the whole run: the handler raises, so `finally` still kills every child.
    def too_long(*_):
        raise TimeoutError(f"the browser test ran past {DEADLINE_S} s")

    signal.signal(signal.SIGALRM, too_long)
    signal.alarm(DEADLINE_S)
    started = time.monotonic()
    run = Run()
    failed = True
    try:
        run.run()
        failed = False
    except Exception as err:  # report, clean up, exit 1
        log(f"FAIL {type(err).__name__}: {err}")
        if run.net_errors:
            log("browser network lines: " + " | ".join(run.net_errors[-5:]))
    finally:
        signal.alarm(0)
        run.cleanup(failed)
    print(f"dashboard browser test: first load {getattr(run, 'first_load', float('nan')):.0f} ms, "
          f"server CPU {getattr(run, 'cpu', float('nan')):.2f} %, assets {getattr(run, 'asset_total', 0):,} B, "
          f"{time.monotonic() - started:.0f} s")
    print(f"{len(run.passed)} passed, {1 if failed else 0} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
