/* Warren dashboard: the whole front end, one vanilla-JS file with no build step.
 *
 * The admin listener serves it with index.html (the dashboard) and login.html (the token
 * form), and uPlot (vendored, MIT) draws the graphs. One Server-Sent Events stream,
 * /api/v1/events, drives every page: `hello` on each (re)connection, `tick` every second
 * (counters and rates), `request` for each captured HTTP request, `log` for each log event.
 * Lists a tick does not carry (sessions, connections, a service's details) are fetched
 * again on each tick, only while a page that shows them is on screen.
 *
 * Security: everything the API returns (headers, bodies, paths, hosts, log messages, config
 * text) enters the page as text, through h() / textContent, never as HTML; the page runs
 * under a strict Content-Security-Policy (no inline script or style, no eval). The admin
 * token lives in an HttpOnly cookie: this file never sees it.
 *
 * Routes (hash): #/overview, #/services, #/services/NAME, #/sessions, #/connections,
 * #/requests, #/requests/ID, #/config, #/logs.
 */
'use strict';

(() => {
  if (document.body.dataset.page === 'login') {
    // The login form posts without JS; this only shows why we came back to it.
    if (new URLSearchParams(location.search).has('failed')) document.getElementById('failed').hidden = false;
    return;
  }

  // ---------------------------------------------------------------- DOM and formatting

  const SVG = 'http://www.w3.org/2000/svg';
  const PAGES = {}; // name -> page constructor (below)

  // Builds an element. String and number children become text nodes (so data never turns
  // into markup); null, undefined and false are skipped; arrays are flattened. Attributes:
  // `on<event>` adds a listener, anything else goes through setAttribute.
  function h(tag, attrs, ...kids) {
    const el = tag.startsWith('svg:') ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid == null || kid === false) continue;
      el.append(kid instanceof Node ? kid : String(kid));
    }
    return el;
  }
  const $ = (sel, root = document) => root.querySelector(sel);
  const text = (el, value) => { const s = String(value); if (el.textContent !== s) el.textContent = s; };

  const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  function bytes(n) {
    if (n == null) return '—';
    let i = 0;
    while (Math.abs(n) >= 1024 && i < UNITS.length - 1) { n /= 1024; i++; }
    return (i === 0 ? String(Math.round(n)) : n.toFixed(n < 10 ? 2 : n < 100 ? 1 : 0)) + ' ' + UNITS[i];
  }
  const rate = (n) => bytes(n) + '/s';
  const num = (n) => (n == null ? '—' : Number(n).toLocaleString('en-US'));
  function micros(us) {
    if (us == null) return '—';
    if (us < 1000) return us + ' µs';
    if (us < 1e6) return (us / 1000).toFixed(us < 1e4 ? 2 : 1) + ' ms';
    return (us / 1e6).toFixed(2) + ' s';
  }
  function span(seconds) {
    seconds = Math.max(0, Math.floor(seconds));
    const d = Math.floor(seconds / 86400), hr = Math.floor(seconds / 3600) % 24, m = Math.floor(seconds / 60) % 60, s = seconds % 60;
    if (d) return `${d}d ${hr}h`;
    if (hr) return `${hr}h ${m}m`;
    if (m) return `${m}m ${s}s`;
    return `${s}s`;
  }
  const ago = (unixSeconds) => span(Date.now() / 1000 - unixSeconds) + ' ago';
  const pad = (n, w = 2) => String(n).padStart(w, '0');
  function clock(ms) {
    const d = new Date(ms);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  }
  // The same in a list cell, the milliseconds in their own span (phones leave them out).
  const clockCell = (ms) => { const c = clock(ms); return [c.slice(0, 8), h('span', { class: 'ms' }, c.slice(8))]; };
  const stamp = (unixSeconds) => new Date(unixSeconds * 1000).toLocaleString();
  const pct = (x) => (x == null ? '—' : (x * 100).toFixed(x && x < 0.1 ? 1 : 0) + ' %');
  const STATE_CLASS = { serving: 'ok', up: 'ok', ready: 'ok', waiting: 'warn', withdrawn: 'warn', unchecked: '', refused: 'bad', down: 'bad' };
  const badge = (word) => h('span', { class: 'badge ' + (STATE_CLASS[word] || '') }, word);
  const statusClass = (status) => 's' + String(status)[0];
  const serviceLink = (name) => h('a', { href: '#/services/' + encodeURIComponent(name) }, name);
  const table = (head, body, cls) => h('div', { class: 'scroll' }, h('table', { class: cls }, h('thead', {}, h('tr', {}, head)), body));
  const th = (label, cls) => h('th', { class: cls }, label);

  // Puts freshly built `rows` (each with a data-key) into `tbody`, keeping every row and
  // cell that did not change. Rebuilding a table each second would otherwise swap the
  // button under the pointer between mousedown and click, and drop the keyboard focus.
  function patchRows(tbody, rows) {
    const old = new Map();
    for (const tr of tbody.children) old.set(tr.dataset.key, tr);
    const want = rows.map((tr) => {
      const prev = old.get(tr.dataset.key);
      if (!prev || prev.children.length !== tr.children.length) return tr;
      for (const a of ['class', 'tabindex']) {
        if (tr.getAttribute(a) !== prev.getAttribute(a)) {
          if (tr.hasAttribute(a)) prev.setAttribute(a, tr.getAttribute(a)); else prev.removeAttribute(a);
        }
      }
      const cells = Array.from(tr.children);
      cells.forEach((td, i) => { if (prev.children[i].outerHTML !== td.outerHTML) prev.replaceChild(td, prev.children[i]); });
      return prev;
    });
    const keep = new Set(want);
    for (const tr of Array.from(tbody.children)) if (!keep.has(tr)) tr.remove();
    want.forEach((tr, i) => { if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null); });
  }

  // Flash messages above the page: outcomes of actions and errors of fetches.
  function flash(message, kind = '', keepMs = 6000) {
    const close = h('button', { type: 'button', class: 'link', 'aria-label': 'Dismiss' }, '×');
    const box = h('div', { class: kind }, h('span', {}, message), close);
    close.addEventListener('click', () => box.remove());
    $('#flash').append(box);
    if (keepMs) setTimeout(() => box.remove(), keepMs);
  }

  // ---------------------------------------------------------------- API

  const toLogin = () => { location.href = '/login'; };

  // fetch() for the JSON API. A 401 means the cookie expired or the token changed: off to
  // the login page. A non-2xx answer throws an Error carrying the status and the JSON body.
  async function api(path, options = {}) {
    // referrerPolicy: with `no-referrer` the browser sends `Origin: null` on a POST, which the
    // backend's CSRF check (rightly) refuses; `same-origin` names this origin and still
    // sends nothing to any other site.
    const res = await fetch(path, { credentials: 'same-origin', cache: 'no-store', referrerPolicy: 'same-origin', ...options });
    if (res.status === 401) { toLogin(); throw new Error('not logged in'); }
    let body = null;
    try { body = await res.json(); } catch (_) { /* not JSON: keep null */ }
    if (!res.ok) {
      const err = new Error((body && body.error) || `${res.status} ${res.statusText}`);
      err.status = res.status;
      err.body = body;
      throw err;
    }
    return body;
  }
  const post = (path, json) => api(path, json === undefined ? { method: 'POST' }
    : { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(json) });

  // ---------------------------------------------------------------- state

  const HISTORY = 300; // points kept for the graphs: 5 minutes of one-second ticks
  const KEEP_REQUESTS = 1000;
  const KEEP_LOGS = 1000;
  const S = {
    status: null, // the last `hello`, plus the time it came (to count uptime on)
    helloAt: 0,
    tick: null,
    services: [], sessions: [], connections: [],
    requests: [], // summaries, newest first
    seen: new Set(), // request ids in `requests`
    noHttp: null, // why this side has no inspector (the 404's message), or null
    logs: [], // oldest first
    hist: { t: [], in: [], out: [], rps: [], err: [], svc: new Map() },
  };

  // Loaders for the lists pages ask for. One fetch of each at a time: a slow answer is
  // not stacked up behind by the next tick.
  const loaders = {
    services: async () => { S.services = await api('/api/v1/services'); },
    sessions: async () => { S.sessions = await api('/api/v1/sessions'); },
    connections: async () => { S.connections = await api('/api/v1/connections'); },
  };
  const inflight = {};
  function load(name) {
    if (!inflight[name]) inflight[name] = loaders[name]().finally(() => { inflight[name] = null; });
    return inflight[name];
  }

  function addRequest(summary, live) {
    if (S.seen.has(summary.id)) return;
    S.seen.add(summary.id);
    if (live) S.requests.unshift(summary); else S.requests.push(summary);
    if (S.requests.length > KEEP_REQUESTS) S.seen.delete(S.requests.pop().id);
  }

  async function loadRequests() {
    try {
      const list = await api('/api/v1/requests?limit=' + KEEP_REQUESTS);
      S.noHttp = null;
      for (const r of list) addRequest(r, false);
      S.requests.sort((a, b) => b.id - a.id);
    } catch (e) {
      if (e.status === 404) S.noHttp = e.message; else throw e;
    }
  }

  async function loadLogs() {
    try {
      const list = await api('/api/v1/logs?limit=' + KEEP_LOGS);
      S.logs = list.concat(S.logs.filter((l) => l.t > (list.length ? list[list.length - 1].t : 0)));
    } catch (e) {
      if (e.status !== 404) throw e;
    }
  }

  // Everything, from scratch: at start and when the process behind the page changed.
  async function loadAll() {
    S.requests = []; S.seen.clear(); S.logs = [];
    await Promise.all([load('services'), load('sessions'), loadRequests(), loadLogs()]);
  }

  // Appends one tick to the graphs' history (all arrays share the time axis).
  function record(tick) {
    const H = S.hist;
    const t = tick.t > 1e11 ? tick.t / 1000 : tick.t; // uPlot wants seconds
    H.t.push(t); H.in.push(tick.rate_in); H.out.push(tick.rate_out);
    H.rps.push(tick.http ? tick.http.rps : null);
    H.err.push(tick.http ? tick.http.rps * (tick.http.error_rate || 0) : null);
    const seen = new Set();
    for (const s of tick.service_rates || []) {
      let sh = H.svc.get(s.name);
      if (!sh) H.svc.set(s.name, sh = { in: new Array(H.t.length - 1).fill(null), out: new Array(H.t.length - 1).fill(null) });
      sh.in.push(s.rate_in); sh.out.push(s.rate_out);
      seen.add(s.name);
    }
    for (const [name, sh] of H.svc) {
      if (!seen.has(name)) { sh.in.push(null); sh.out.push(null); }
    }
    if (H.t.length > HISTORY) {
      for (const a of [H.t, H.in, H.out, H.rps, H.err]) a.shift();
      for (const [name, sh] of H.svc) {
        sh.in.shift(); sh.out.shift();
        if (!sh.in.some((v) => v != null)) H.svc.delete(name); // gone for 5 minutes
      }
    }
  }

  const rateOf = (name) => (S.tick && S.tick.service_rates || []).find((s) => s.name === name);

  // ---------------------------------------------------------------- graphs

  // Time-axis labels: the wall clock, with seconds only where a label falls between minutes.
  function hhmm(sec) {
    const d = new Date(sec * 1000);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}` + (d.getSeconds() ? ':' + pad(d.getSeconds()) : '');
  }
  const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

  // A uPlot time-series graph filling `el`'s width, redrawn by set(data) and resized with
  // its box. `series`: [{label, color (a CSS variable), fmt}].
  function graph(el, series, height = 220, floor = 1024) {
    const grid = css('--grid'), muted = css('--muted');
    const axis = { stroke: muted, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } };
    const yfmt = series[0].fmt;
    const opts = {
      width: Math.max(200, el.clientWidth), height,
      legend: { show: false },
      cursor: { drag: { x: false, y: false }, points: { size: 6 } },
      // Always the last 5 minutes, filling from the right, whatever the points so far.
      scales: { x: { time: true, range: (u, min, max) => [max - HISTORY, max] }, y: { range: (u, min, max) => [0, Math.max(max * 1.1, floor)] } },
      axes: [{ ...axis, space: 70, values: (u, vals) => vals.map(hhmm) }, { ...axis, size: 86, values: (u, vals) => vals.map((v) => yfmt(v)) }],
      series: [{}].concat(series.map((s) => {
        const c = css(s.color);
        return { label: s.label, stroke: c, width: 1.5, fill: c + '1f', points: { show: false } };
      })),
    };
    const data = [[], ...series.map(() => [])];
    const u = new uPlot(opts, data, el);
    const ro = new ResizeObserver(() => { if (el.clientWidth) u.setSize({ width: el.clientWidth, height }); });
    ro.observe(el);
    return {
      set(d) {
        u.setData(d);
        // Kept for the browser test: how many points are drawn and the largest value.
        el.dataset.n = d[0].length;
        el.dataset.max = Math.max(0, ...d.slice(1).flat().filter((v) => v != null));
      },
      destroy() { ro.disconnect(); u.destroy(); },
    };
  }
  const legend = (...items) => h('span', { class: 'legend' }, items.map(([cls, label]) => h('span', { class: cls }, h('i'), label)));

  // A small inline sparkline (SVG) of a service's last minute, in and out.
  function spark(name) {
    const sh = S.hist.svc.get(name);
    const svg = h('svg:svg', { class: 'spark', viewBox: '0 0 90 22', preserveAspectRatio: 'none', 'aria-hidden': 'true' });
    if (!sh) return svg;
    const ins = sh.in.slice(-60), outs = sh.out.slice(-60);
    const max = Math.max(1, ...ins, ...outs);
    // One point per second of the minute, right-aligned: a new service's line grows in.
    const pts = (vals) => vals.map((v, i) => `${(90 - (vals.length - 1 - i) * 1.5).toFixed(1)},${(21 - (v || 0) / max * 20).toFixed(1)}`).join(' ');
    svg.append(h('svg:polyline', { class: 'in', points: pts(ins) }), h('svg:polyline', { class: 'out', points: pts(outs) }));
    return svg;
  }

  // ---------------------------------------------------------------- pages
  //
  // A page is a function (arg, params) -> { el, needs, update(), keys(e), reroute(arg,
  // params), leave() }: `el` is mounted once; update() refreshes it in place on every tick
  // (after the lists in `needs` are fetched), so inputs keep their focus and text.

  function head(title, sub, ...right) {
    return h('div', { class: 'pagehead' }, h('div', {}, h('h1', {}, title), sub && h('p', { class: 'sub' }, sub)), right.length ? h('div', { class: 'toolbar' }, right) : null);
  }

  function card(key, label, cls) {
    const v = h('div', { class: 'v' }, '—'), s = h('div', { class: 's' });
    const el = h('div', { class: 'card ' + (cls || ''), 'data-k': key }, h('div', { class: 'k' }, label), v, s);
    return {
      el,
      set(value, sub, raw) {
        text(v, value); text(s, sub || '');
        if (raw != null) el.dataset.value = raw;
      },
    };
  }

  function connectHint() {
    // The exact command for a first client: this server's address when the backend tells
    // it (`bind`; an unspecified IP becomes the host the dashboard was opened on), and one
    // of its services.
    const st = S.status || {};
    let host = location.hostname, port = '7000';
    const m = /^(.*):(\d+)$/.exec(st.bind || '');
    if (m) {
      port = m[2];
      if (!['0.0.0.0', '[::]', '::'].includes(m[1])) host = m[1];
    }
    if (host.includes(':') && !host.startsWith('[')) host = `[${host}]`;
    const svc = S.services.find((x) => x.kind !== 'http') || S.services[0];
    const name = svc ? svc.name : 'web';
    return [
      '# client.toml, on the machine behind NAT',
      '[client]',
      `server = "${host}:${port}"`,
      'psk = "${WARREN_PSK}"                 # this server\'s psk',
      'default_token = "${WARREN_TOKEN}"     # and its default_token',
      '',
      `[client.services.${/^[A-Za-z0-9_-]+$/.test(name) ? name : JSON.stringify(name)}]`,
      svc && svc.kind === 'http' ? 'type = "http"\ntarget = "127.0.0.1:3000"' : 'target = "127.0.0.1:3000"          # the local service to expose',
      '',
      '# then:',
      'WARREN_PSK=… WARREN_TOKEN=… warren client client.toml',
    ].join('\n');
  }

  PAGES.overview = () => {
    const c = {
      sessions: card('sessions', 'Sessions'),
      services: card('services', 'Services'),
      connections: card('connections', 'Open connections'),
      in: card('in', 'In (visitor → target)', 'in'),
      out: card('out', 'Out (target → visitor)', 'out'),
      rps: card('rps', 'HTTP requests/s'),
      errors: card('error_rate', 'HTTP errors'),
    };
    const empty = h('div', { class: 'empty', hidden: true });
    const traffic = h('div', { class: 'chart', id: 'chart-traffic' });
    const httpPanel = h('section', { class: 'panel', hidden: true },
      h('h2', {}, 'HTTP requests, last 5 minutes', legend(['rps', 'requests/s'], ['err', 'errors/s (5xx)'])),
      h('div', { class: 'chart', id: 'chart-http' }));
    const sub = h('p', { class: 'sub' });
    const el = h('div', {},
      h('div', { class: 'pagehead' }, h('div', {}, h('h1', {}, 'Overview'), sub)),
      empty,
      h('div', { class: 'cards' }, Object.values(c).map((x) => x.el)),
      h('section', { class: 'panel' }, h('h2', {}, 'Traffic, last 5 minutes', legend(['in', 'in'], ['out', 'out'])), traffic),
      httpPanel);
    let g = null, gh = null;
    return {
      el,
      update() {
        const st = S.status, t = S.tick;
        if (st) text(sub, `${st.side} · version ${st.version} · up ${span(st.uptime_seconds + (Date.now() - S.helloAt) / 1000)} · started ${stamp(st.started)}`);
        if (!t) return;
        c.sessions.set(num(t.sessions), st && st.side === 'client' ? 'with servers' : 'clients connected', t.sessions);
        c.services.set(num(t.services), '', t.services);
        c.connections.set(num(t.connections), '', t.connections);
        c.in.set(rate(t.rate_in), bytes(t.bytes_in) + ' total', t.bytes_in);
        c.out.set(rate(t.rate_out), bytes(t.bytes_out) + ' total', t.bytes_out);
        const http = t.http;
        c.rps.el.hidden = c.errors.el.hidden = httpPanel.hidden = !http;
        if (http) {
          c.rps.set(http.rps.toFixed(http.rps < 10 ? 1 : 0), num(http.requests) + ' total', http.requests);
          c.errors.set(pct(http.error_rate), `${num(http.errors)} 5xx · ${num(http.client_errors)} 4xx total`, http.errors);
        }
        // The empty state: nobody connected yet.
        if (t.sessions === 0) {
          const server = st && st.side === 'server';
          empty.replaceChildren(
            h('h2', {}, server ? 'No client is connected yet' : 'Not connected to a server yet'),
            server ? h('p', {}, 'Connect a client to this server:')
              : h('p', {}, 'The client keeps trying; the Logs page says why it has not connected.'),
            server && h('pre', {}, connectHint()));
          empty.hidden = false;
        } else empty.hidden = true;
        if (!g && window.uPlot) g = graph(traffic, [{ label: 'in', color: '--in', fmt: rate }, { label: 'out', color: '--out', fmt: rate }]);
        if (g) g.set([S.hist.t, S.hist.in, S.hist.out]);
        if (http && !gh && window.uPlot) gh = graph($('#chart-http', el), [{ label: 'req/s', color: '--rps', fmt: (v) => v.toFixed(v < 10 ? 1 : 0) }, { label: 'errors/s', color: '--err', fmt: (v) => v.toFixed(1) }], 160, 1);
        if (gh) gh.set([S.hist.t, S.hist.rps, S.hist.err]);
      },
      leave() { if (g) g.destroy(); if (gh) gh.destroy(); },
    };
  };

  // How many sessions serve a service: the server lists them per service; a client knows
  // which of its sessions claim it.
  function servingCount(svc) {
    if (svc.sessions) return svc.sessions.filter((s) => s.ready).length;
    return S.sessions.filter((s) => (s.services || []).includes(svc.name)).length;
  }
  const where = (svc) => svc.address || (svc.hosts || []).join(', ') || '—';

  PAGES.services = (name, params) => (name ? serviceDetail(name) : servicesList(params));

  function servicesList() {
    const filter = h('input', { type: 'search', placeholder: 'Filter services', 'aria-label': 'Filter services' });
    const body = h('tbody');
    const more = h('div', { class: 'more' });
    const el = h('div', {}, head('Services', 'Live; rates are bytes per second over the last second.', filter),
      h('section', { class: 'panel' }, table([th('Name'), th('Type'), th('Address or hosts'), th('State'), th('Sessions', 'num'),
        th('Open', 'num'), th('Total', 'num'), th('In', 'num'), th('Out', 'num'), th('Last minute'), th('Errors', 'num')], body), more));
    filter.addEventListener('input', () => page.update());
    return {
      el, needs: ['services', 'sessions'],
      update() {
        const q = filter.value.trim().toLowerCase();
        const list = S.services.filter((s) => !q || s.name.toLowerCase().includes(q) || where(s).toLowerCase().includes(q));
        patchRows(body, list.slice(0, 500).map((s) => {
          const r = rateOf(s.name) || s;
          return h('tr', { 'data-key': s.name, 'data-service': s.name },
            h('td', {}, serviceLink(s.name)), h('td', {}, s.kind), h('td', { class: 'mono' }, where(s)),
            h('td', {}, badge(r.state || s.state)), h('td', { class: 'num' }, servingCount(s)),
            h('td', { class: 'num', 'data-k': 'active' }, num(r.active_connections)), h('td', { class: 'num' }, num(r.total_connections)),
            h('td', { class: 'num', 'data-k': 'bytes_in', 'data-value': r.bytes_in }, bytes(r.bytes_in), r.rate_in ? h('div', { class: 'muted' }, rate(r.rate_in)) : null),
            h('td', { class: 'num', 'data-k': 'bytes_out', 'data-value': r.bytes_out }, bytes(r.bytes_out), r.rate_out ? h('div', { class: 'muted' }, rate(r.rate_out)) : null),
            h('td', {}, spark(s.name)), h('td', { class: 'num' }, num(r.errors)));
        }));
        text(more, list.length ? (list.length > 500 ? `Showing 500 of ${list.length}; filter to find the others.` : '') : S.services.length ? 'No service matches.' : 'This side has no services.');
      },
    };
  }

  function serviceDetail(name) {
    const c = {
      open: card('active', 'Open connections'), total: card('total', 'Total connections'),
      in: card('in', 'In', 'in'), out: card('out', 'Out', 'out'), errors: card('errors', 'Errors'),
    };
    const sub = h('p', { class: 'sub' });
    const title = h('h1', {}, name);
    const chartEl = h('div', { class: 'chart', id: 'chart-service' });
    const info = h('dl', { class: 'kv' });
    const chain = h('div');
    const serving = h('div');
    const conns = h('div');
    const setConns = connTable(conns, 200, 'No open connection.');
    const el = h('div', {},
      h('div', { class: 'pagehead' }, h('div', {}, h('p', { class: 'sub' }, h('a', { href: '#/services' }, '← Services')), title, sub)),
      h('div', { class: 'cards' }, Object.values(c).map((x) => x.el)),
      h('section', { class: 'panel' }, h('h2', {}, 'Traffic, last 5 minutes', legend(['in', 'in'], ['out', 'out'])), chartEl),
      h('div', { class: 'grid2' },
        h('section', { class: 'panel' }, h('h2', {}, 'Routing'), info),
        h('section', { class: 'panel' }, h('h2', {}, 'Middleware chain'), chain)),
      h('section', { class: 'panel' }, h('h2', {}, 'Sessions serving it'), serving),
      h('section', { class: 'panel' }, h('h2', {}, 'Live connections'), conns));
    let g = null;
    return {
      el, needs: ['services', 'connections', 'sessions'],
      update() {
        const svc = S.services.find((s) => s.name === name);
        if (!svc) { text(sub, 'No such service (any more): it may have been removed by a reload.'); return; }
        const r = rateOf(name) || svc;
        title.replaceChildren(name, ' ', badge(svc.kind), ' ', badge(r.state || svc.state));
        text(sub, where(svc));
        c.open.set(num(r.active_connections), '', r.active_connections);
        c.total.set(num(r.total_connections), svc.retries ? `${num(svc.retries)} retried on another session` : '', r.total_connections);
        c.in.set(rate(r.rate_in || 0), bytes(r.bytes_in) + ' total', r.bytes_in);
        c.out.set(rate(r.rate_out || 0), bytes(r.bytes_out) + ' total', r.bytes_out);
        c.errors.set(num(r.errors), '', r.errors);
        const rows = [['Type', svc.kind]];
        if (svc.address) rows.push(['Address', svc.address]);
        if (svc.hosts) rows.push(['Hosts', svc.hosts.join(', ')]);
        if (svc.paths) rows.push(['Paths', svc.paths.join(', ')]);
        if (svc.load_balance) rows.push(['Load balance', svc.load_balance]);
        if (svc.health) rows.push(['Target health', badge(svc.health)]);
        info.replaceChildren(...rows.flatMap(([k, v]) => [h('dt', {}, k), h('dd', { class: 'mono' }, v)]));
        if (svc.kind === 'http') {
          info.append(h('dt', {}, 'Requests'), h('dd', {}, h('a', { href: '#/requests?service=' + encodeURIComponent(name) }, 'open in the inspector')));
        }
        chain.replaceChildren(svc.middleware && svc.middleware.length
          ? h('ol', { class: 'chain' }, svc.middleware.map((m) => h('li', {}, h('span', { class: 'mono' }, m.name), ' ',
            h('span', { class: m.rejected ? 'badge warn' : 'badge' }, `${num(m.rejected)} rejected`))))
          : h('p', { class: 'muted' }, svc.kind === 'http' ? 'No middleware: every request goes to the backend.' : 'Middleware applies to HTTP services only.'));
        const ss = svc.sessions || S.sessions.filter((s) => (s.services || []).includes(name)).map((s) => ({ session: s.id, peer: s.peer, open_streams: s.open_streams, ready: true }));
        serving.replaceChildren(ss.length
          ? table([th('Session'), th('Peer'), th('Ready'), th('Weight', 'num'), th('Open streams', 'num'), th('Picked', 'num')],
            h('tbody', {}, ss.map((s) => h('tr', {}, h('td', { class: 'mono' }, s.session), h('td', { class: 'mono' }, s.peer),
              h('td', {}, badge(s.ready ? 'ready' : 'withdrawn')), h('td', { class: 'num' }, s.weight == null ? '—' : s.weight),
              h('td', { class: 'num' }, num(s.open_streams)), h('td', { class: 'num' }, s.picked == null ? '—' : num(s.picked))))))
          : h('p', { class: 'muted' }, 'No session serves it now.'));
        setConns(S.connections.filter((x) => x.service === name));
        const sh = S.hist.svc.get(name);
        if (!g && window.uPlot) g = graph(chartEl, [{ label: 'in', color: '--in', fmt: rate }, { label: 'out', color: '--out', fmt: rate }]);
        if (g && sh) g.set([S.hist.t, sh.in, sh.out]);
      },
      leave() { if (g) g.destroy(); },
    };
  }

  // A live connections table: call the returned function with the list on each tick.
  function connTable(box, max, emptyText) {
    const body = h('tbody');
    const more = h('div', { class: 'more' });
    const tbl = table([th('Id', 'num'), th('Service'), th('Peer'), th('Since'), th('In', 'num'), th('Out', 'num')], body);
    box.replaceChildren(tbl, more);
    return (list, noneText) => {
      tbl.hidden = !list.length;
      patchRows(body, list.slice(0, max).map((x) => h('tr', { 'data-key': x.id },
        h('td', { class: 'num' }, x.id), h('td', {}, serviceLink(x.service)), h('td', { class: 'mono' }, x.peer),
        h('td', { title: stamp(x.since) }, ago(x.since)), h('td', { class: 'num' }, bytes(x.bytes_in)), h('td', { class: 'num' }, bytes(x.bytes_out)))));
      text(more, list.length > max ? `Showing ${max} of ${num(list.length)}; filter to narrow.` : list.length ? '' : noneText || emptyText);
    };
  }

  PAGES.sessions = () => {
    const body = h('tbody');
    const none = h('p', { class: 'muted' });
    const tbl = table([th('Id'), th('Peer'), th('Protocol'), th('Transport'), th('Cipher'), th('Since'),
      th('RTT', 'num'), th('Streams', 'num'), th('Services'), th('')], body);
    const el = h('div', {}, head('Sessions', 'Client–server associations: a control channel and its streams.'), h('section', { class: 'panel' }, tbl, none));
    const armed = new Map(); // session id -> when its button was armed by a first click
    function disconnect(id) {
      // Two clicks: the first arms the button for 4 s, the second disconnects. No modal
      // dialog, so the keyboard stays on the button.
      const at = armed.get(id);
      if (!at || Date.now() - at > 4000) {
        const now = Date.now();
        armed.set(id, now);
        setTimeout(() => { if (armed.get(id) === now) { armed.delete(id); if (page && page.el === el) page.update(); } }, 4000);
        page.update();
        return;
      }
      armed.delete(id);
      post('/api/v1/sessions/' + encodeURIComponent(id) + '/disconnect')
        .then(() => flash(`Session ${id} disconnected.`, 'ok'), (e) => flash(`Could not disconnect ${id}: ${e.message}`, 'bad'))
        .then(() => load('sessions')).then(() => { if (page && page.el === el) page.update(); }, () => {});
    }
    return {
      el, needs: ['sessions'],
      update() {
        const client = S.status && S.status.side === 'client';
        tbl.hidden = !S.sessions.length;
        text(none, S.sessions.length ? '' : client ? 'No session with a server yet: the client keeps retrying (see Logs).' : 'No client is connected.');
        patchRows(body, S.sessions.map((s) => {
          const rtt = s.rtt_ms != null ? s.rtt_ms : s.quic && s.quic.rtt_ms;
          const isArmed = armed.has(s.id);
          return h('tr', { 'data-key': s.id, 'data-session': s.id },
            h('td', { class: 'mono' }, s.id, s.state === 'suspect'
              ? [' ', h('span', { class: 'badge warn', title: 'The peer left a heartbeat unanswered: it gets no new streams until it answers, and is dropped if it stays silent.' }, 'suspect')]
              : false),
            h('td', { class: 'mono' }, s.server ? `${s.server} (${s.peer})` : s.peer),
            h('td', {}, s.version != null ? 'v' + s.version : '—'), h('td', {}, s.transport), h('td', { class: 'mono' }, s.cipher),
            h('td', { title: stamp(s.since) }, ago(s.since)), h('td', { class: 'num' }, rtt == null ? '—' : rtt.toFixed(rtt < 10 ? 2 : 1) + ' ms'),
            h('td', { class: 'num' }, num(s.open_streams)),
            h('td', { class: 'wrap' }, s.services.length ? s.services.map((n, i) => [i ? ', ' : '', serviceLink(n)]) : h('span', { class: 'muted' }, 'probe')),
            h('td', {}, h('button', { type: 'button', class: 'danger' + (isArmed ? ' armed' : ''), onclick: () => disconnect(s.id) },
              isArmed ? 'Confirm disconnect' : 'Disconnect')));
        }));
      },
    };
  };

  PAGES.connections = () => {
    const filter = h('input', { type: 'search', placeholder: 'Filter: service, peer or id', 'aria-label': 'Filter connections' });
    const count = h('span', { class: 'muted' });
    const body = h('div');
    const setConns = connTable(body, 500, 'No open connection.');
    filter.addEventListener('input', () => page.update());
    const el = h('div', {}, head('Connections', 'Open visitor connections, live.', filter, count), h('section', { class: 'panel' }, body));
    return {
      el, needs: ['connections'],
      update() {
        const q = filter.value.trim().toLowerCase();
        const list = S.connections.filter((x) => !q || x.service.toLowerCase().includes(q) || x.peer.toLowerCase().includes(q) || String(x.id) === q);
        text(count, `${num(list.length)} of ${num(S.connections.length)}`);
        setConns(list, S.connections.length ? 'No connection matches.' : 'No open connection.');
      },
    };
  };

  // ---------------------------------------------------------------- requests (inspector)

  const RF = { service: '', cls: '', q: '' }; // the filters, kept across visits
  const details = new Map(); // id -> CapturedRequest (they never change once captured)

  PAGES.requests = (id, params) => {
    if (params.has('service')) RF.service = params.get('service');
    const services = h('select', { 'aria-label': 'Service' });
    const cls = h('select', { 'aria-label': 'Status' }, ['', '2', '3', '4', '5'].map((v) => h('option', { value: v }, v ? v + 'xx' : 'any status')));
    const q = h('input', { type: 'search', placeholder: 'Filter: method, host, path, status, IP', 'aria-label': 'Filter requests' });
    cls.value = RF.cls; q.value = RF.q;
    const body = h('tbody');
    const more = h('div', { class: 'more' });
    const list = h('section', { class: 'panel list' },
      table([th('Time'), th('Method'), th('Host', 'opt'), th('Path'), th('Status', 'num'), th('Duration', 'num opt'), th('Size', 'num opt'), th('Client', 'opt')], body, 'reqs'), more);
    const detail = h('section', { class: 'panel detail' });
    const box = h('div', { class: 'inspector' }, list, detail);
    const el = h('div', {}, head('Requests', 'j / k or ↑ / ↓ to move, Enter to open, Esc to close.', services, cls, q), box);
    let selected = id ? Number(id) : null; // the open request
    let cursor = selected; // the keyboard's row
    let shown = []; // the filtered list, as on screen
    let dirty = true, timer = null;

    for (const [input, key] of [[services, 'service'], [cls, 'cls'], [q, 'q']]) {
      input.addEventListener(input === q ? 'input' : 'change', () => { RF[key] = input.value; dirty = true; renderList(); });
    }

    function matches(r) {
      if (RF.service && r.service !== RF.service) return false;
      if (RF.cls && String(r.status)[0] !== RF.cls) return false;
      const s = RF.q.trim().toLowerCase();
      return !s || [r.method, r.host, r.uri, String(r.status), r.client_ip, r.service].some((f) => f && f.toLowerCase().includes(s));
    }

    function renderList() {
      dirty = false;
      services.hidden = cls.hidden = q.hidden = !!S.noHttp;
      if (S.noHttp) {
        box.replaceChildren(h('div', { class: 'empty' }, h('h2', {}, 'No request inspector here'),
          h('p', {}, S.noHttp), h('p', {}, 'HTTP services (type = "http") are routed by the server: open the server\'s dashboard to inspect their requests.')));
        return;
      }
      if (list.parentNode !== box) box.replaceChildren(list, detail); // an inspector again
      const names = S.services.filter((s) => s.kind === 'http').map((s) => s.name);
      if (RF.service && !names.includes(RF.service)) names.push(RF.service);
      if (services.dataset.names !== names.join('\n')) {
        services.dataset.names = names.join('\n');
        services.replaceChildren(h('option', { value: '' }, 'all services'), names.map((n) => h('option', { value: n }, n)));
      }
      services.value = RF.service;
      shown = S.requests.filter(matches);
      patchRows(body, shown.slice(0, 500).map((r) => h('tr', {
        class: 'clickable' + (r.id === cursor ? ' sel' : ''), 'data-key': r.id, 'data-id': r.id, tabindex: r.id === cursor ? 0 : -1,
        onclick: () => open(r.id),
      },
      h('td', { title: new Date(r.at_ms).toLocaleString() }, clockCell(r.at_ms)), h('td', {}, r.method), h('td', { class: 'mono opt' }, r.host),
      h('td', { class: 'path', title: r.uri }, r.uri), h('td', { class: 'num ' + statusClass(r.status) }, r.status),
      h('td', { class: 'num opt' }, micros(r.total_us)), h('td', { class: 'num opt' }, bytes(r.response_bytes)), h('td', { class: 'mono opt' }, r.client_ip))));
      text(more, shown.length > 500 ? `Showing the newest 500 of ${num(shown.length)}.` : shown.length ? '' : S.requests.length ? 'No request matches the filters.' : 'No request captured yet: requests to this side\'s HTTP services appear here as they happen.');
    }
    // Requests can come by the hundred each second: redraw the list at most twice a second.
    function soon() {
      dirty = true;
      if (!timer) timer = setTimeout(() => { timer = null; if (dirty) renderList(); }, 500);
    }

    function moveCursor(step) {
      if (!shown.length) return;
      let i = shown.findIndex((r) => r.id === cursor);
      i = i < 0 ? 0 : Math.min(shown.length - 1, Math.max(0, i + step));
      cursor = shown[i].id;
      for (const tr of body.querySelectorAll('tr.sel')) { tr.classList.remove('sel'); tr.tabIndex = -1; }
      const tr = body.querySelector(`tr[data-id="${cursor}"]`);
      if (tr) { tr.classList.add('sel'); tr.tabIndex = 0; tr.focus({ preventScroll: true }); tr.scrollIntoView({ block: 'nearest' }); }
      if (selected != null) open(cursor); // with a detail open, it follows the cursor
    }
    function moveCursorTo(rid) {
      for (const tr of body.querySelectorAll('tr.sel')) tr.classList.remove('sel');
      const tr = rid != null && body.querySelector(`tr[data-id="${rid}"]`);
      if (tr) { tr.classList.add('sel'); tr.scrollIntoView({ block: 'nearest' }); }
    }
    function open(rid) { location.hash = '#/requests/' + rid; }

    async function showDetail() {
      box.classList.toggle('has-detail', selected != null);
      if (selected == null) { detail.replaceChildren(); return; }
      const rid = selected;
      let r = details.get(rid);
      if (!r) {
        detail.replaceChildren(h('p', { class: 'muted' }, 'Loading…'));
        try { r = await api('/api/v1/requests/' + rid); details.set(rid, r); } catch (e) {
          if (selected === rid) detail.replaceChildren(closeLink(), h('p', {}, e.message));
          return;
        }
        if (details.size > 200) details.delete(details.keys().next().value);
      }
      if (selected === rid) detail.replaceChildren(...requestDetail(r));
    }

    renderList();
    showDetail();
    return {
      el,
      update() { if (dirty) renderList(); },
      onRequest() { soon(); },
      reset() { details.clear(); soon(); },
      reroute(rid, p) {
        if (p.has('service')) { RF.service = p.get('service'); renderList(); }
        selected = rid ? Number(rid) : null;
        if (selected != null) cursor = selected;
        moveCursorTo(cursor);
        showDetail();
        return true;
      },
      keys(e) {
        if (e.key === 'j' || e.key === 'ArrowDown') { moveCursor(1); return true; }
        if (e.key === 'k' || e.key === 'ArrowUp') { moveCursor(-1); return true; }
        if (e.key === 'Enter' && cursor != null && cursor !== selected) { open(cursor); return true; }
        if (e.key === 'Escape' && selected != null) { location.hash = '#/requests'; return true; }
        return false;
      },
      leave() { clearTimeout(timer); },
    };
  };

  const closeLink = () => h('p', { class: 'sub' }, h('a', { href: '#/requests' }, '← All requests'));

  // Pretty-prints a JSON body; anything else is shown as it came.
  function pretty(body, headers) {
    const type = (headers.find(([k]) => k.toLowerCase() === 'content-type') || [, ''])[1];
    const t = body.trim();
    if (/json/i.test(type) || /^[[{]/.test(t)) {
      try { return JSON.stringify(JSON.parse(t), null, 2); } catch (_) { /* not JSON after all */ }
    }
    return body;
  }

  const HIDDEN_IN_CURL = new Set(['host', 'content-length', 'connection', 'x-forwarded-for', 'x-forwarded-proto', 'x-forwarded-host']);
  const shq = (s) => "'" + String(s).replace(/'/g, "'\\''") + "'";
  function curlOf(r) {
    const url = (r.tls ? 'https://' : 'http://') + r.host + r.uri;
    const parts = ['curl'];
    if (r.method !== 'GET' || r.request_body) parts.push('-X', r.method);
    parts.push(shq(url));
    for (const [k, v] of r.request_headers) {
      if (HIDDEN_IN_CURL.has(k.toLowerCase()) || v === '(redacted)') continue; // secrets never reach the inspector
      parts.push('-H', shq(`${k}: ${v}`));
    }
    if (r.request_body) parts.push('--data-binary', shq(r.request_body));
    return parts.join(' ');
  }

  function headersTable(list) {
    if (!list.length) return h('p', { class: 'muted' }, 'none');
    return h('table', { class: 'hdrs' }, h('tbody', {}, list.map(([k, v]) => h('tr', {}, h('td', {}, k), h('td', {}, v)))));
  }

  function requestDetail(r) {
    const result = h('div');
    const editor = h('div', { hidden: true });
    const curlBox = h('pre', { class: 'body curl', hidden: true });
    async function replay(changes) {
      result.replaceChildren(h('p', { class: 'muted' }, 'Replaying…'));
      try {
        const out = await post(`/api/v1/requests/${r.id}/replay`, changes);
        result.replaceChildren(h('p', { class: 'replayed', 'data-new-id': out.id }, `Replayed as `, h('a', { href: '#/requests/' + out.id }, '#' + out.id),
          ' → ', h('span', { class: statusClass(out.status) }, out.status)));
      } catch (e) {
        result.replaceChildren(h('p', { class: 'error' }, 'Replay refused: ' + e.message));
      }
    }
    const method = h('input', { type: 'text', value: r.method, 'aria-label': 'Method', name: 'method' });
    const uri = h('input', { type: 'text', value: r.uri, 'aria-label': 'Path and query', name: 'uri' });
    const hdrs = h('textarea', { rows: Math.min(14, r.request_headers.length + 2), name: 'headers', 'aria-label': 'Headers, one "Name: value" per line' });
    hdrs.value = r.request_headers.map(([k, v]) => `${k}: ${v}`).join('\n');
    const body = h('textarea', { rows: 6, name: 'body', 'aria-label': 'Body' });
    body.value = r.request_body || '';
    editor.append(
      h('label', { class: 'f' }, 'Method', method), h('label', { class: 'f' }, 'Path and query', uri),
      h('label', { class: 'f' }, 'Headers, one "Name: value" a line (a "(redacted)" value is sent as captured)', hdrs),
      h('label', { class: 'f' }, 'Body', body),
      h('div', { class: 'toolbar' },
        h('button', { type: 'button', class: 'primary', onclick: () => {
          const headers = hdrs.value.split('\n').map((l) => l.trim()).filter(Boolean).map((l) => {
            const i = l.indexOf(':');
            return i > 0 ? [l.slice(0, i).trim(), l.slice(i + 1).trim()] : [l, ''];
          });
          const changes = { method: method.value.trim(), uri: uri.value.trim(), headers };
          if (body.value !== (r.request_body || '') || body.value) changes.body = body.value;
          replay(changes);
        } }, 'Send'),
        h('button', { type: 'button', onclick: () => { editor.hidden = true; } }, 'Cancel')));

    const copy = async () => {
      const cmd = curlOf(r);
      curlBox.textContent = cmd;
      curlBox.hidden = false;
      try { await navigator.clipboard.writeText(cmd); flash('Copied the curl command.', 'ok', 2500); } catch (_) {
        // No clipboard (not a secure context): the command is on screen to copy by hand.
        const range = document.createRange(); range.selectNodeContents(curlBox);
        getSelection().removeAllRanges(); getSelection().addRange(range);
      }
    };
    const headUs = r.head_us || 0, totalUs = Math.max(1, r.total_us || 0);
    const bar = h('div', { class: 'timing' }, h('div'));
    bar.firstChild.style.width = Math.min(100, headUs / totalUs * 100).toFixed(1) + '%'; // a CSSOM write, allowed by the CSP
    return [
      closeLink(),
      h('div', { class: 'reqline' }, h('strong', {}, r.method), ' ', r.host, r.uri),
      h('p', {}, h('span', { class: 'badge ' + (r.status >= 500 ? 'bad' : r.status >= 400 ? 'warn' : 'ok') }, r.status), ' ',
        h('span', { class: 'muted' }, `${r.version} · ${r.tls ? 'TLS' : 'plain'} · ${micros(r.total_us)} · ${bytes(r.response_bytes)}`),
        r.replay_of != null ? [' · replay of ', h('a', { href: '#/requests/' + r.replay_of }, '#' + r.replay_of)] : null),
      h('div', { class: 'actions' },
        h('button', { type: 'button', class: 'primary', onclick: () => replay(undefined) }, 'Replay'),
        h('button', { type: 'button', onclick: () => { editor.hidden = !editor.hidden; if (!editor.hidden) hdrs.focus(); } }, 'Edit and replay'),
        h('button', { type: 'button', onclick: copy }, 'Copy as curl')),
      result, editor, curlBox,
      h('dl', { class: 'kv' },
        h('dt', {}, 'Request'), h('dd', {}, '#' + r.id),
        h('dt', {}, 'Time'), h('dd', {}, new Date(r.at_ms).toLocaleString() + ' (' + clock(r.at_ms) + ')'),
        h('dt', {}, 'Service'), h('dd', {}, serviceLink(r.service)),
        h('dt', {}, 'Client'), h('dd', { class: 'mono' }, r.client_ip)),
      h('h2', {}, 'Timings'),
      bar,
      h('p', { class: 'muted' }, `response head after ${micros(r.head_us)}, body done after ${micros(r.total_us)}`),
      h('h2', {}, 'Middleware decisions'),
      r.decisions.length ? h('ol', { class: 'chain' }, r.decisions.map(([m, d]) => h('li', {}, h('span', { class: 'mono' }, m), ': ', d))) : '',
      chainNote(r),
      h('h2', {}, 'Request headers'), headersTable(r.request_headers),
      h('h2', {}, 'Request body'), bodyView('request', r.request_body, r.request_headers, r.request_body_complete),
      h('h2', {}, 'Response headers'), headersTable(r.response_headers),
      h('h2', {}, 'Response body'), bodyView('response', r.response_body, r.response_headers, true),
    ];
  }

  // The service's chain as it is now, for context: a middleware that let a request through
  // without a word records no decision.
  function chainNote(r) {
    const svc = S.services.find((x) => x.name === r.service);
    const chain = (svc && svc.middleware || []).map((m) => m.name);
    if (!chain.length) return r.decisions.length ? '' : h('p', { class: 'muted' }, 'The service has no middleware: the request went straight to the backend.');
    return h('p', { class: 'muted' }, (r.decisions.length ? 'The chain: ' : 'No middleware objected or noted anything. The chain: ') + chain.join(' → '));
  }

  function bodyView(which, body, headers, complete) {
    return h('div', { 'data-body': which }, body == null ? h('p', { class: 'muted' }, 'Not captured (set capture_body_bytes on the service to keep bodies).')
      : body === '' ? h('p', { class: 'muted' }, 'empty')
        : [h('pre', { class: 'body' }, pretty(body, headers)), complete ? null : h('p', { class: 'muted' }, 'Only the first bytes were captured.')]);
  }

  // ---------------------------------------------------------------- config and logs

  PAGES.config = () => {
    const sub = h('p', { class: 'sub' });
    const result = h('div');
    const code = h('ol', { class: 'code' });
    const reload = h('button', { type: 'button', class: 'primary', id: 'reload' }, 'Reload');
    const el = h('div', {}, h('div', { class: 'pagehead' }, h('div', {}, h('h1', {}, 'Config'), sub), h('div', { class: 'toolbar' }, reload)),
      result, h('section', { class: 'panel' }, h('h2', {}, 'In force (secrets masked)'), code));
    async function fetchConfig() {
      try {
        const cfg = await api('/api/v1/config');
        text(sub, cfg.path);
        code.replaceChildren(...cfg.text.replace(/\n$/, '').split('\n').map((line) => h('li', {}, line)));
      } catch (e) {
        if (e.status === 501) { reload.disabled = true; text(sub, ''); code.replaceChildren(h('li', {}, e.message)); }
        else code.replaceChildren(h('li', {}, 'Could not read the config: ' + e.message));
      }
    }
    reload.addEventListener('click', async () => {
      reload.disabled = true;
      result.replaceChildren(h('p', { class: 'muted' }, 'Reloading…'));
      try {
        const out = await post('/api/v1/reload');
        result.replaceChildren(h('div', { class: 'panel', 'data-outcome': 'applied' }, h('h2', {}, 'Reloaded'), h('p', {}, out.summary),
          out.applied.length ? h('ul', {}, out.applied.map((a) => h('li', {}, a))) : null,
          out.needs_restart.length ? [h('p', {}, 'Needs a restart to take effect:'), h('ul', {}, out.needs_restart.map((a) => h('li', {}, a)))] : null));
        fetchConfig();
        load('services').catch(() => {});
      } catch (e) {
        const errs = (e.body && e.body.errors) || [];
        result.replaceChildren(h('div', { class: 'panel', 'data-outcome': 'refused' },
          h('h2', {}, 'Reload refused: the running config is kept'),
          h('p', { class: 'error' }, e.message),
          errs.length ? h('ul', { class: 'errors' }, errs.map((x) => h('li', { 'data-line': x.line },
            h('strong', {}, x.line != null ? `line ${x.line}${x.column != null ? ', column ' + x.column : ''}` : 'file'), ': ',
            x.key ? [h('code', {}, x.key), ': '] : null, x.message,
            x.hint ? h('div', { class: 'hint' }, x.hint) : null))) : null));
      } finally { reload.disabled = false; }
    });
    fetchConfig();
    return { el };
  };

  const LF = { level: '', q: '' };
  const LEVELS = ['ERROR', 'WARN', 'INFO', 'DEBUG', 'TRACE'];
  PAGES.logs = () => {
    const level = h('select', { 'aria-label': 'Level' }, h('option', { value: '' }, 'all levels'), LEVELS.map((l) => h('option', { value: l }, l + ' and above')));
    const q = h('input', { type: 'search', placeholder: 'Filter: event, message, field', 'aria-label': 'Filter logs' });
    level.value = LF.level; q.value = LF.q;
    const body = h('tbody');
    const more = h('div', { class: 'more' });
    const el = h('div', {}, head('Logs', 'Recent events of this process, newest first, live.', level, q),
      h('section', { class: 'panel' }, table([th('Time', 'c-time'), th('Level', 'c-level'), th('Event', 'opt c-event'), th('Message')], body, 'logs'), more));
    let timer = null;
    function render() {
      timer = null;
      const max = LF.level ? LEVELS.indexOf(LF.level) : 99;
      const s = LF.q.trim().toLowerCase();
      const list = [];
      for (let i = S.logs.length - 1; i >= 0 && list.length < 500; i--) {
        const l = S.logs[i];
        const li = LEVELS.indexOf(l.level);
        if (li > max && li >= 0) continue;
        if (s && ![l.event, l.message, ...Object.entries(l.fields || {}).flat()].some((f) => f && String(f).toLowerCase().includes(s))) continue;
        list.push(l);
      }
      body.replaceChildren(...list.map((l) => h('tr', {},
        h('td', { title: new Date(l.t).toLocaleString() }, clockCell(l.t)), h('td', { class: 'lvl-' + l.level }, l.level),
        h('td', { class: 'mono opt' }, l.event || ''),
        h('td', { class: 'msg' }, l.event ? h('span', { class: 'ev' }, l.event) : null, l.message, ' ', Object.entries(l.fields || {}).map(([k, v]) => h('span', { class: 'field' }, `${k}=${v}`))))));
      text(more, list.length ? '' : S.logs.length ? 'No log event matches.' : 'No log event yet.');
    }
    level.addEventListener('change', () => { LF.level = level.value; render(); });
    q.addEventListener('input', () => { LF.q = q.value; render(); });
    render();
    return {
      el,
      onLog() { if (!timer) timer = setTimeout(render, 300); },
      reset() { render(); },
      leave() { clearTimeout(timer); },
    };
  };

  // ---------------------------------------------------------------- router

  let page = null;
  let pageName = '';
  const main = $('#main');

  function parseHash() {
    const [path, query] = (location.hash || '#/overview').replace(/^#\/?/, '').split('?');
    const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
    return { name: PAGES[parts[0]] ? parts[0] : 'overview', arg: parts[1], params: new URLSearchParams(query || '') };
  }

  function route() {
    const { name, arg, params } = parseHash();
    $('#nav').classList.remove('open');
    $('#menu').setAttribute('aria-expanded', 'false');
    // Inside one page (a request opened, the filter in the hash changed): let the page
    // follow without rebuilding, so the list keeps its scroll position and filters.
    if (page && name === pageName && page.reroute && page.reroute(arg, params)) return;
    if (page && page.leave) page.leave();
    pageName = name;
    page = PAGES[name](arg, params);
    main.replaceChildren(page.el);
    for (const a of document.querySelectorAll('nav a')) {
      if (a.dataset.nav === name) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
    document.title = `Warren · ${name[0].toUpperCase() + name.slice(1)}`;
    refresh();
  }

  // Brings the page up to date: fetch what it shows, then redraw. Skipped while the tab is
  // hidden (the graphs' history still records every tick).
  function refresh() {
    if (!page || document.hidden || !S.status) return;
    const p = page;
    Promise.all((p.needs || []).map(load)).then(() => { if (p === page && p.update) p.update(); }, (e) => {
      if (e.message !== 'not logged in') console.warn('refresh:', e.message);
    });
  }

  // ---------------------------------------------------------------- the event stream

  let es = null;
  let lastEvent = 0;
  let reconnectDelay = 1000;
  const live = $('#live');
  function setLive(state, label) { live.dataset.state = state; text(live, label || state); }

  function connect() {
    if (es) es.close();
    setLive('connecting', 'connecting');
    lastEvent = Date.now();
    es = new EventSource('/api/v1/events');
    const on = (type, fn) => es.addEventListener(type, (e) => {
      lastEvent = Date.now();
      let data;
      try { data = JSON.parse(e.data); } catch (_) { return; }
      fn(data);
    });
    on('hello', onHello);
    on('tick', (t) => {
      // The stream skips `request` events it could not send in time; the last tick named
      // the newest capture, so if that one never came, fetch the list again.
      const missed = S.tick && S.tick.latest_request != null && !S.seen.has(S.tick.latest_request) &&
        (!S.requests.length || S.tick.latest_request > S.requests[S.requests.length - 1].id);
      if (missed && !inflight.requests) {
        inflight.requests = loadRequests().then(() => { if (page && page.onRequest) page.onRequest(); }, () => {}).finally(() => { inflight.requests = null; });
      }
      S.tick = t;
      record(t);
      setLive('live');
      refresh();
    });
    on('request', (r) => { addRequest(r, true); if (page && page.onRequest) page.onRequest(); });
    on('log', (l) => {
      S.logs.push(l);
      if (S.logs.length > KEEP_LOGS) S.logs.shift();
      if (page && page.onLog) page.onLog();
    });
    es.onerror = () => {
      setLive('down', 'reconnecting');
      // A refused connection is retried by the browser itself (CONNECTING); a non-2xx
      // answer closes the stream for good (CLOSED): find out why, then start a new one.
      if (es.readyState === EventSource.CLOSED) retrySoon();
    };
  }

  function retrySoon() {
    setTimeout(() => {
      api('/api/v1/status').then(() => { reconnectDelay = 1000; connect(); }, () => {
        reconnectDelay = Math.min(reconnectDelay * 2, 8000);
        retrySoon();
      });
    }, reconnectDelay);
  }

  // A stream that went quiet (a tick is due every second) is dead even when the socket
  // has not said so: start a new one.
  setInterval(() => {
    if (S.status && Date.now() - lastEvent > 5000 && es && es.readyState !== EventSource.CLOSED) {
      setLive('down', 'reconnecting');
      es.close();
      retrySoon();
    }
  }, 2500);

  async function onHello(hello) {
    const restarted = S.status && S.status.started !== hello.started;
    const first = !S.status;
    S.status = hello;
    S.helloAt = Date.now();
    $('#side').textContent = `${hello.side} · v${hello.version}`;
    if (hello.auth === false) $('#logout').hidden = true;
    if (first || restarted) {
      // A new process (or the first look): every list is stale.
      if (restarted) { details.clear(); flash(`The ${hello.side} restarted; the page reloaded its data.`, '', 5000); }
      try { await loadAll(); } catch (e) { flash('Could not load: ' + e.message, 'bad'); }
      if (first) route();
      else if (page) { if (page.reset) page.reset(); refresh(); }
    }
  }

  // ---------------------------------------------------------------- wiring

  $('#menu').addEventListener('click', () => {
    const open = $('#nav').classList.toggle('open');
    $('#menu').setAttribute('aria-expanded', String(open));
  });
  window.addEventListener('hashchange', route);
  document.addEventListener('visibilitychange', refresh);
  document.addEventListener('keydown', (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const t = e.target;
    const typing = t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.tagName === 'SELECT' || t.isContentEditable);
    if (typing && e.key !== 'Escape') return;
    if (t && (t.tagName === 'BUTTON' || t.tagName === 'A') && e.key === 'Enter') return; // buttons and links do their own
    if (page && page.keys && page.keys(e)) e.preventDefault();
  });
  // The graphs take their colours when they are made: make the page again on a switch.
  matchMedia('(prefers-color-scheme: dark)').addEventListener('change', () => { if (page && page.leave) page.leave(); page = null; route(); });

  main.replaceChildren(h('p', { class: 'muted' }, 'Connecting…'));
  connect();
})();
