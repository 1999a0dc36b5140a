// snapfence operator page: plain JavaScript, no dependencies, no build step.
//
// It talks only to this server's public /v1 API, with the API key the operator enters: the key is
// kept in sessionStorage (gone when the tab closes), never put in a URL, and sent as
// `Authorization: Bearer`. The API decides what the key may see; the page only hides what the key
// could not do. Everything is drawn with textContent and DOM calls, never from markup, so nothing
// the API returns is ever read as HTML. The open view is read again whenever GET /v1/watch says
// something changed; only while that stream fails is it read every few seconds instead. A waiting
// acquire changes nothing until it is granted, so the stream says nothing of it: while a lease on
// screen is held (the only kind a request waits for), the lease list is read every few seconds
// for its queues.
'use strict';

(() => {
  const REFRESH_MS = 5000;
  // The owners shown of each key's queue; the cell counts the rest.
  const QUEUE_SHOWN = 3;
  // After the change stream fails: polling, and a new try at the stream this much later (doubling
  // up to a minute while it keeps failing).
  const WATCH_RETRY_MS = 15e3;
  // Changes that come together are drawn with one read of the view.
  const WATCH_BATCH_MS = 250;
  const KEY_STORAGE = 'snapfence.apiKey';
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const REASONS = ['stale_token', 'unknown_token'];
  // The chart reads at most this many pages of 1000 refusals per window.
  const CHART_PAGES = 10;
  // Each window's bars, and the interval of its time labels (on round UTC times).
  const WINDOWS = {
    '1h': { span: 3600e3, bucket: 60e3, label: 10 * 60e3 },
    '6h': { span: 6 * 3600e3, bucket: 5 * 60e3, label: 3600e3 },
    '24h': { span: 24 * 3600e3, bucket: 15 * 60e3, label: 3 * 3600e3 },
    '7d': { span: 7 * 24 * 3600e3, bucket: 2 * 3600e3, label: 24 * 3600e3 },
  };

  const $ = (sel, root = document) => root.querySelector(sel);
  const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

  const state = {
    view: 'leases',
    access: 'unknown', // admin | reader | none | unknown
    skewMs: 0, // server clock minus this browser's, from the Date header
    busy: false,
    queueReads: 0, // reads of the lease list for its queues while the stream is live
    again: false,
    probedFor: null, // the key the access was learned for, and when
    probedAt: 0,
    leases: { prefix: '', state: '', cursors: [null], page: 0, next: null, confirm: null },
    recovery: { cursors: [null], page: 0, next: null, confirm: null },
    audit: { filters: {}, limit: 50, cursors: [null], page: 0, next: null },
    chart: { window: '1h', prefix: '', principal: '*', principals: new Set(), items: [], truncated: false },
    snapshots: { key: '', prefix: null, cursors: [null], page: 0, next: null },
    // The change stream: `live` while GET /v1/watch streams, `polling` while it fails.
    watch: { mode: 'connecting', lastId: null, abort: null, retryMs: WATCH_RETRY_MS, batch: null, events: 0, polls: 0 },
  };

  // ---- Building the DOM -------------------------------------------------------------------

  /** An element with attributes (`class`, `data-*`, …) and children (strings become text). */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : String(child));
    }
    return el;
  }

  function svg(tag, attrs, ...children) {
    const el = document.createElementNS(SVG_NS, tag);
    setAttrs(el, attrs);
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      el.append(child instanceof Node ? child : String(child));
    }
    return el;
  }

  function setAttrs(el, attrs) {
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith('on')) el.addEventListener(name.slice(2), value);
      else el.setAttribute(name, value === true ? '' : String(value));
    }
  }

  // ---- Talking to the API -----------------------------------------------------------------

  class ApiFailure extends Error {
    constructor(status, problem) {
      super((problem && problem.detail) || `the server answered ${status}`);
      this.status = status;
      this.code = problem && problem.code;
    }
  }

  // Fencing tokens go up to 2^63-1: a number past 2^53 is kept as its exact decimal text.
  function parseJson(text) {
    return JSON.parse(text, (_key, value, context) =>
      typeof value === 'number' && !Number.isSafeInteger(value) && Number.isInteger(value) && context && context.source
        ? context.source
        : value);
  }

  function apiKey() {
    return sessionStorage.getItem(KEY_STORAGE) || '';
  }

  /** Calls the API (a path relative to the page, `v1/…`); returns the parsed JSON or the response. */
  async function api(path, { method = 'GET', headers = {}, body: payload = undefined, raw = false, signal = undefined } = {}) {
    const sent = new Headers(headers);
    const key = apiKey();
    if (key) sent.set('Authorization', `Bearer ${key}`);
    let response;
    try {
      response = await fetch(path, { method, headers: sent, body: payload, cache: 'no-store', credentials: 'omit', signal });
    } catch (e) {
      throw new ApiFailure(0, { detail: `the server could not be reached (${e.message})` });
    }
    noteClock(response);
    if (raw && response.ok) return response;
    const text = await response.text();
    let body = null;
    if (text) {
      try { body = parseJson(text); } catch (_) { body = null; }
    }
    if (response.status === 401 && state.access !== 'none') state.probedAt = 0;
    if (!response.ok) throw new ApiFailure(response.status, body);
    return body;
  }

  // Expiry is decided by the database clock; the countdowns use the server's Date header to
  // correct for a browser clock that is off by more than a second or two.
  function noteClock(response) {
    const date = Date.parse(response.headers.get('Date') || '');
    if (Number.isNaN(date)) return;
    const offset = date + 500 - Date.now();
    state.skewMs = Math.abs(offset) > 2000 ? offset : 0;
  }

  const now = () => Date.now() + state.skewMs;

  // A view may be read by the refresh and by the operator's click at once: only the answer to
  // the latest read of each is drawn.
  const latest = {};
  function ticket(name) {
    latest[name] = (latest[name] || 0) + 1;
    const mine = latest[name];
    return () => latest[name] === mine;
  }

  const seg = (key) => encodeURIComponent(key);

  function query(params) {
    const q = new URLSearchParams();
    for (const [name, value] of Object.entries(params)) {
      if (value !== '' && value !== null && value !== undefined) q.set(name, value);
    }
    const s = q.toString();
    return s ? `?${s}` : '';
  }

  // ---- Formatting ---------------------------------------------------------------------------

  function utc(iso) {
    if (!iso) return '';
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return iso;
    return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  }

  function hhmm(ms, withDay) {
    const s = new Date(ms).toISOString();
    return withDay ? `${s.slice(5, 10)} ${s.slice(11, 16)}` : s.slice(11, 16);
  }

  function duration(ms) {
    const s = Math.round(Math.abs(ms) / 1000);
    if (s < 60) return `${s} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} min ${String(s % 60).padStart(2, '0')} s`;
    const hr = Math.floor(m / 60);
    if (hr < 48) return `${hr} h ${String(m % 60).padStart(2, '0')} min`;
    return `${Math.floor(hr / 24)} d ${hr % 24} h`;
  }

  function bytes(n) {
    if (n < 1024) return `${n} B`;
    const units = ['KiB', 'MiB', 'GiB'];
    let v = n;
    let i = -1;
    do { v /= 1024; i += 1; } while (v >= 1024 && i < units.length - 1);
    return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
  }

  function metadataCell(metadata, pretty) {
    if (metadata === null || metadata === undefined) return h('td', { class: 'meta muted' }, '—');
    const text = JSON.stringify(metadata, null, pretty ? 2 : 0);
    return h('td', { class: 'meta' }, pretty ? h('pre', {}, text) : h('code', { title: JSON.stringify(metadata, null, 2) }, text));
  }

  const mono = (text) => h('span', { class: 'mono' }, text);

  // ---- Access -------------------------------------------------------------------------------

  // What the key may do is learned from the API itself: the audit log answers only admin keys
  // (or anyone, on a loopback server with no API keys configured).
  // Asked again when the key changes, when a call is refused 401, and every half minute (a key's
  // scope cannot change, but it can be revoked, and the server can gain its first key).
  const PROBE_MS = 30e3;
  async function probeAccess() {
    const key = apiKey();
    if (state.probedFor === key && Date.now() - state.probedAt < PROBE_MS && state.access !== 'unknown') return;
    state.probedFor = key;
    state.probedAt = Date.now();
    let access = 'unknown';
    try {
      await api('v1/audit/rejections?limit=1');
      access = 'admin';
    } catch (e) {
      if (e.status === 401) access = 'none';
      else if (e.status === 403) access = 'reader';
    }
    if (access !== state.access) {
      state.access = access;
      state.leases.confirm = null;
    }
    renderAccess();
  }

  function renderAccess() {
    document.body.dataset.access = state.access;
    const hasKey = Boolean(apiKey());
    const label = {
      admin: hasKey ? 'key · admin' : 'no key needed · admin',
      reader: hasKey ? 'key · read-only' : 'read-only',
      none: hasKey ? 'key refused' : 'API key required',
      unknown: 'server not answering',
    }[state.access];
    $('#access').textContent = label;
    $('#api-key').placeholder = hasKey ? 'replace the key (sf_…)' : 'API key (sf_…)';
    $('#forget-key').hidden = !hasKey;
    const admin = state.access === 'admin';
    for (const el of $$('.admin-only, .admin-data')) el.hidden = !admin;
    const notice = $('.needs-admin');
    notice.hidden = admin || state.access === 'unknown';
    notice.textContent = state.access === 'none'
      ? 'This server needs an API key: enter one above. The audit log of refused writes needs an admin key.'
      : 'The audit log of refused writes needs an admin API key; this key may not read it.';
  }

  // ---- Views --------------------------------------------------------------------------------

  // Every read of the open view ends here: the footer then says when what is on screen was read,
  // or that the last read failed and since when the screen is that old. A 404 is an answer.
  function setError(box, error) {
    footer(error && error.status !== 404 ? error : null);
    if (!error) { box.hidden = true; return; }
    box.textContent = error.status === 401 ? `This server needs an API key: enter one above. (${error.message})` : error.message;
    box.hidden = false;
  }

  function footer(error) {
    const el = $('#updated');
    const at = new Date(now()).toISOString().slice(11, 19);
    if (!error) {
      state.readAt = at;
      el.textContent = `updated ${at} UTC`;
      el.dataset.state = 'updated';
    } else {
      el.textContent = state.readAt
        ? `could not refresh at ${at} UTC (${error.message}); showing what was read at ${state.readAt} UTC`
        : `could not load at ${at} UTC: ${error.message}`;
      el.dataset.state = 'failed';
    }
  }

  function pager(name, s) {
    const el = $(`.pager[data-for="${name}"]`);
    el.querySelector('[data-page="first"]').disabled = s.page === 0;
    el.querySelector('[data-page="next"]').disabled = !s.next;
    el.querySelector('.page-no').textContent = `page ${s.page + 1}`;
  }

  // Leases.

  async function loadLeases() {
    const s = state.leases;
    const card = $('#view-leases .card');
    const current = ticket('leases');
    try {
      const page = await api(`v1/leases${query({ prefix: s.prefix, state: s.state, limit: 100, cursor: s.cursors[s.page] })}`);
      const queues = await Promise.all(page.items.map(queueOf));
      if (!current()) return;
      s.next = page.next_cursor;
      renderLeases(page.items, queues);
      setError($('.error', card), null);
      $('#view-leases').dataset.loaded = String(Date.now());
    } catch (e) {
      if (current()) setError($('.error', card), e);
    }
    pager('leases', s);
  }

  // The first waiters of a key that has any (each key's status counts them); null when none
  // wait, or when its queue could not be read (the count still shows).
  async function queueOf(item) {
    if (!item.waiters) return null;
    try {
      return (await api(`v1/leases/${seg(item.key)}/waiters?limit=${QUEUE_SHOWN}`)).items;
    } catch (_) {
      return null;
    }
  }

  function renderLeases(items, queues) {
    const admin = state.access === 'admin';
    const rows = items.map((item, i) => {
      const lease = item.lease;
      return h('tr', { 'data-key': item.key, 'data-state': item.state, 'data-waiters': item.waiters || 0 },
        h('td', { class: 'key' }, h('a', { href: `#snapshots/${seg(item.key)}`, title: 'Show the snapshot versions of this key' }, item.key)),
        h('td', {}, h('span', { class: `badge ${item.state}` }, item.state)),
        h('td', { class: 'holder' }, lease.owner),
        waitersCell(item.waiters || 0, queues[i]),
        h('td', { class: 'num mono' }, String(lease.token)),
        h('td', {}, expiryCell(item)),
        metadataCell(lease.metadata, false),
        admin ? h('td', { class: 'admin-only actions' }, actions(item)) : null);
    });
    $('#lease-table tbody').replaceChildren(...rows);
    $('#view-leases .empty').hidden = items.length > 0;
    tick();
  }

  // How many wait for the key, and who first: `2 · worker-8, worker-9`, each owner's wait in its
  // title.
  function waitersCell(count, queue) {
    if (!count) return h('td', { class: 'waiters muted' }, '—');
    const shown = queue || [];
    const names = shown.map((w, i) => h('li', { title: `#${w.position}, waiting since ${utc(w.since)}` },
      w.owner === null ? '(unnamed)' : w.owner, i < shown.length - 1 ? ', ' : null));
    const rest = count - shown.length;
    return h('td', { class: 'waiters', title: `${count} waiting, first to be granted first` },
      h('b', { class: 'count' }, String(count)),
      names.length ? [' ', h('ol', { class: 'queue' }, names, rest > 0 ? h('li', { class: 'muted' }, ` +${rest}`) : null)] : null);
  }

  function expiryCell(item) {
    const lease = item.lease;
    const expires = Date.parse(lease.expires_at);
    if (item.state === 'held') {
      return h('div', {},
        h('span', { class: 'countdown', 'data-expires': expires, title: utc(lease.expires_at) }),
        h('progress', { class: 'ttl', max: lease.ttl_ms, value: Math.max(0, expires - now()), 'data-expires': expires }));
    }
    if (item.state === 'released') return h('span', { class: 'muted nowrap' }, 'released');
    const ended = item.recovery ? Date.parse(item.recovery.ended_at) : expires;
    const verb = item.state === 'expired' || (item.recovery && item.recovery.reason === 'expired') ? 'expired' : 'ended';
    return h('span', { class: 'muted nowrap', title: utc(item.recovery ? item.recovery.ended_at : lease.expires_at) },
      `${verb} `, h('span', { class: 'since', 'data-since': ended }));
  }

  // One of the two changes the page makes (the other: reconciling, below): an admin may abandon a held lease (with its own token, as
  // the holder would), which frees the key and keeps a recovery record, so whoever takes the key
  // next must reconcile first. The holder's later writes are refused as stale.
  function actions(item) {
    if (item.state !== 'held') return h('span', { class: 'muted' }, '');
    const s = state.leases;
    if (s.confirm && s.confirm.key === item.key && String(s.confirm.token) === String(item.lease.token)) {
      return h('div', { class: 'confirm' },
        h('span', {}, `Abandon ${item.lease.owner}'s lease?`),
        h('button', { type: 'button', class: 'danger small', 'data-action': 'confirm-abandon', onclick: () => abandon(item) }, 'Abandon'),
        h('button', { type: 'button', class: 'quiet small', onclick: () => { s.confirm = null; loadLeases(); } }, 'Cancel'));
    }
    return h('button', {
      type: 'button',
      class: 'quiet small',
      'data-action': 'abandon',
      title: 'Free the key but keep a recovery record: the next holder must reconcile',
      onclick: () => { s.confirm = { key: item.key, token: item.lease.token }; loadLeases(); },
    }, 'Abandon…');
  }

  async function abandon(item) {
    state.leases.confirm = null;
    try {
      await api(`v1/leases/${seg(item.key)}/abandon`, { method: 'POST', headers: { 'Fencing-Token': String(item.lease.token) } });
      banner(`Abandoned ${item.lease.owner}'s lease of ${item.key} (token ${item.lease.token}). A recovery record stays until the next holder acquires with "reconciled": true.`);
    } catch (e) {
      banner(`Could not abandon ${item.key}: ${e.message}`, true);
    }
    refresh();
  }

  // Recovery records.

  async function loadRecovery() {
    const s = state.recovery;
    const card = $('#view-recovery .card');
    const current = ticket('recovery');
    try {
      const page = await api(`v1/leases${query({ state: 'recovery_pending', limit: 100, cursor: s.cursors[s.page] })}`);
      if (!current()) return;
      s.next = page.next_cursor;
      const admin = state.access === 'admin';
      const rows = page.items.map((item) => {
        const r = item.recovery || {};
        return h('tr', { 'data-key': item.key, 'data-state': item.state },
          h('td', { class: 'key' }, h('a', { href: `#snapshots/${seg(item.key)}` }, item.key)),
          h('td', {}, h('span', { class: 'badge reason' }, r.reason || '?')),
          h('td', { class: 'holder' }, r.owner || ''),
          h('td', { class: 'num mono' }, String(r.token || '')),
          h('td', { class: 'nowrap' }, utc(r.acquired_at)),
          h('td', { class: 'nowrap' }, utc(r.ended_at)),
          metadataCell(r.metadata, true),
          admin ? h('td', { class: 'admin-only actions' }, reconcileAction(item)) : null);
      });
      $('#recovery-table tbody').replaceChildren(...rows);
      $('#view-recovery .empty').hidden = rows.length > 0;
      setError($('.error', card), null);
      $('#view-recovery').dataset.loaded = String(Date.now());
    } catch (e) {
      if (current()) setError($('.error', card), e);
    }
    pager('recovery', s);
  }

  // An admin may reconcile a key from here, saying that what its previous holder left behind has
  // been dealt with: the page acquires the key with "reconciled": true (which moves the record to
  // the audit log, under the name "operator page") and releases it at once, so the key is free.
  // The same confirmation as an abandon comes first.
  function reconcileAction(item) {
    const s = state.recovery;
    const r = item.recovery || {};
    if (item.state !== 'recovery_pending') return h('span', { class: 'muted' }, '');
    if (s.confirm === item.key) {
      return h('div', { class: 'confirm' },
        h('span', {}, `Has what ${r.owner || 'the previous holder'} left been dealt with?`),
        h('button', { type: 'button', class: 'danger small', 'data-action': 'confirm-reconcile', onclick: () => reconcile(item) }, 'Reconcile'),
        h('button', { type: 'button', class: 'quiet small', onclick: () => { s.confirm = null; loadRecovery(); } }, 'Cancel'));
    }
    return h('button', {
      type: 'button',
      class: 'quiet small',
      'data-action': 'reconcile',
      title: 'Say that the previous holder\'s leftovers are dealt with: the record goes to the audit log and the key is free',
      onclick: () => { s.confirm = item.key; loadRecovery(); },
    }, 'Reconcile…');
  }

  async function reconcile(item) {
    state.recovery.confirm = null;
    const r = item.recovery || {};
    try {
      const grant = await api(`v1/leases/${seg(item.key)}`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ owner: 'operator page', ttl_ms: 10000, reconciled: true }),
      });
      await api(`v1/leases/${seg(item.key)}`, { method: 'DELETE', headers: { 'Fencing-Token': String(grant.token) } });
      banner(`Reconciled ${item.key}: the recovery record left by ${r.owner || 'its previous holder'} (token ${r.token}) is in the audit log, and the key is free.`);
    } catch (e) {
      banner(`Could not reconcile ${item.key}: ${e.message}`, true);
    }
    refresh();
  }

  // The tab's badge: how many keys wait for a reconciliation (first page).
  async function loadRecoveryCount() {
    const badge = $('#recovery-count');
    try {
      const page = await api('v1/leases?state=recovery_pending&limit=100');
      const n = page.items.length;
      badge.textContent = page.next_cursor ? `${n}+` : String(n);
      badge.hidden = n === 0;
    } catch (_) {
      badge.hidden = true;
    }
  }

  // Refused writes: the chart.

  async function loadChart() {
    const c = state.chart;
    const win = WINDOWS[c.window];
    const box = $('#chart-card .error');
    const since = new Date(Math.floor((now() - win.span) / win.bucket) * win.bucket + win.bucket);
    const current = ticket('chart');
    try {
      const items = [];
      let cursor = null;
      let pages = 0;
      do {
        const page = await api(`v1/audit/rejections${query({ since: since.toISOString(), limit: 1000, cursor })}`);
        items.push(...page.items);
        cursor = page.next_cursor;
        pages += 1;
      } while (cursor && pages < CHART_PAGES);
      if (!current()) return;
      c.items = items;
      c.truncated = Boolean(cursor);
      c.since = since.getTime();
      setError(box, null);
      renderPrincipals(items);
      drawChart();
    } catch (e) {
      if (current()) setError(box, e);
    }
  }

  function renderPrincipals(items) {
    const c = state.chart;
    for (const item of items) c.principals.add(item.principal === null || item.principal === undefined ? '' : item.principal);
    const select = $('#chart-filter select[name="principal"]');
    const names = Array.from(c.principals).sort();
    const options = [h('option', { value: '*' }, 'any')].concat(names.map((p) => h('option', { value: p }, p === '' ? '(no key)' : p)));
    select.replaceChildren(...options);
    select.value = names.includes(c.principal) ? c.principal : '*';
  }

  function drawChart() {
    const c = state.chart;
    const win = WINDOWS[c.window];
    const n = Math.round(win.span / win.bucket);
    const start = c.since;
    const buckets = Array.from({ length: n }, () => ({ stale_token: 0, unknown_token: 0 }));
    const totals = { stale_token: 0, unknown_token: 0 };
    for (const item of c.items) {
      if (c.prefix && !item.key.startsWith(c.prefix)) continue;
      const principal = item.principal === null || item.principal === undefined ? '' : item.principal;
      if (c.principal !== '*' && principal !== c.principal) continue;
      const i = Math.floor((Date.parse(item.at) - start) / win.bucket);
      if (i < 0 || i >= n || !(item.reason in totals)) continue;
      buckets[i][item.reason] += 1;
      totals[item.reason] += 1;
    }
    for (const r of REASONS) $(`#total-${r}`).textContent = String(totals[r]);
    $('#chart-note').textContent = c.truncated ? `only the newest ${c.items.length} refusals of the window are drawn` : 'click a bar to list its refusals';

    const W = Math.max(480, Math.round($('#chart').clientWidth || 960));
    const H = 220;
    const pad = { left: 44, right: 12, top: 12, bottom: 28 };
    const plotW = W - pad.left - pad.right;
    const plotH = H - pad.top - pad.bottom;
    const max = Math.max(1, ...buckets.map((b) => b.stale_token + b.unknown_token));
    const step = niceStep(max);
    const top = Math.ceil(max / step) * step;
    const y = (v) => pad.top + plotH - (v / top) * plotH;
    const bw = plotW / n;
    const root = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'Refused writes per interval, stacked by reason' });

    for (let v = 0; v <= top; v += step) {
      root.append(svg('line', { class: v === 0 ? 'axis' : 'grid-line', x1: pad.left, x2: W - pad.right, y1: y(v), y2: y(v) }));
      root.append(svg('text', { x: pad.left - 8, y: y(v) + 4, 'text-anchor': 'end' }, String(v)));
    }
    const withDay = win.span > 24 * 3600e3;
    const end = start + n * win.bucket;
    const xOf = (t) => pad.left + ((t - start) / (end - start)) * plotW;
    for (let t = Math.ceil(start / win.label) * win.label; t <= end; t += win.label) {
      const x = xOf(t);
      if (x > W - pad.right - 40) break; // leave room for the "UTC" label
      root.append(svg('line', { class: 'axis', x1: x, x2: x, y1: pad.top + plotH, y2: pad.top + plotH + 4 }));
      root.append(svg('text', { x, y: H - 8, 'text-anchor': 'middle' }, hhmm(t, withDay)));
    }
    root.append(svg('text', { x: W - pad.right, y: H - 8, 'text-anchor': 'end' }, 'UTC'));

    buckets.forEach((b, i) => {
      let base = 0;
      for (const reason of REASONS) {
        const count = b[reason];
        if (!count) continue;
        const from = start + i * win.bucket;
        const rect = svg('rect', {
          class: `bar ${reason}`,
          'data-reason': reason,
          'data-count': count,
          'data-start': new Date(from).toISOString(),
          x: pad.left + i * bw + Math.min(1, bw * 0.1),
          width: Math.max(1, bw - Math.min(2, bw * 0.2)),
          y: y(base + count),
          height: Math.max(1, y(base) - y(base + count)),
        }, svg('title', {}, `${count} ${reason} · ${hhmm(from, withDay)}–${hhmm(from + win.bucket, withDay)} UTC`));
        rect.addEventListener('click', () => listBucket(from, from + win.bucket, reason));
        root.append(rect);
        base += count;
      }
    });
    if (totals.stale_token + totals.unknown_token === 0) {
      root.append(svg('text', { class: 'empty-note', x: pad.left + plotW / 2, y: pad.top + plotH / 2, 'text-anchor': 'middle' }, 'No refused writes in this window'));
    }
    $('#chart').replaceChildren(root);
  }

  function niceStep(max) {
    const raw = max / 4;
    const mag = 10 ** Math.floor(Math.log10(raw));
    const norm = raw / mag;
    const nice = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10;
    return Math.max(1, nice * mag);
  }

  function listBucket(from, until, reason) {
    const form = $('#audit-filter');
    form.elements.since.value = new Date(from).toISOString();
    form.elements.until.value = new Date(until).toISOString();
    form.elements.reason.value = reason;
    applyAuditFilters();
  }

  // Refused writes: the table, with the audit API's own filters, keyset-paged.

  function applyAuditFilters() {
    const form = $('#audit-filter');
    const a = state.audit;
    a.filters = {
      key: form.elements.key.value,
      reason: form.elements.reason.value,
      since: form.elements.since.value.trim(),
      until: form.elements.until.value.trim(),
    };
    a.limit = Number(form.elements.limit.value);
    a.cursors = [null];
    a.page = 0;
    loadAudit();
  }

  async function loadAudit() {
    const a = state.audit;
    const card = $('#audit-card');
    const current = ticket('audit');
    try {
      const page = await api(`v1/audit/rejections${query({ ...a.filters, limit: a.limit, cursor: a.cursors[a.page] })}`);
      if (!current()) return;
      a.next = page.next_cursor;
      const rows = page.items.map((item) => h('tr', { 'data-id': item.id, 'data-key': item.key, 'data-reason': item.reason },
        h('td', { class: 'nowrap' }, utc(item.at)),
        h('td', { class: 'key' }, item.key),
        h('td', {}, h('span', { class: `badge ${item.reason}` }, item.reason)),
        h('td', { class: 'num mono' }, String(item.presented_token)),
        h('td', { class: 'num mono' }, item.highest_token === null ? '—' : String(item.highest_token)),
        h('td', { class: 'holder' }, item.holder || '—'),
        h('td', {}, item.operation),
        h('td', {}, item.principal || h('span', { class: 'muted' }, '(no key)')),
        h('td', { class: 'mono' }, item.remote_addr || ''),
        h('td', { class: 'mono muted' }, item.request_id || '')));
      $('#audit-table tbody').replaceChildren(...rows);
      $('#audit-card .empty').hidden = rows.length > 0;
      setError($('.error', card), null);
      $('#view-refused').dataset.loaded = String(Date.now());
    } catch (e) {
      if (current()) setError($('.error', card), e);
    }
    pager('refused', a);
  }

  async function loadRefused() {
    if (state.access !== 'admin') return;
    await loadChart();
    await loadAudit();
  }

  // The keys under a prefix that hold a snapshot (GET /v1/snapshots), a page of 100 at a time.
  async function loadSnapshotKeys() {
    const s = state.snapshots;
    const card = $('#snapshot-keys-card');
    const body = $('#snapshot-keys-table tbody');
    const pagerEl = $('.pager[data-for="snapshot-keys"]');
    if (s.prefix === null) {
      $('.empty', card).hidden = true;
      pagerEl.hidden = true;
      return;
    }
    const current = ticket('snapshot-keys');
    try {
      const page = await api(`v1/snapshots${query({ prefix: s.prefix, limit: 100, cursor: s.cursors[s.page] })}`);
      if (!current()) return;
      s.next = page.next_cursor;
      const rows = page.items.map((m) => h('tr', { 'data-key': m.key },
        h('td', { class: 'key' }, h('a', { href: `#snapshots/${seg(m.key)}`, title: 'Show its versions' }, m.key)),
        h('td', { class: 'num mono' }, String(m.version)),
        h('td', { class: 'num', title: `${m.size} bytes` }, bytes(m.size)),
        h('td', { class: 'num mono' }, String(m.token)),
        h('td', { class: 'mono' }, m.content_type),
        h('td', { class: 'nowrap' }, utc(m.updated_at))));
      body.replaceChildren(...rows);
      $('.empty', card).hidden = rows.length > 0;
      setError($('.error', card), null);
      card.dataset.loaded = String(Date.now());
    } catch (e) {
      if (current()) setError($('.error', card), e);
    }
    pagerEl.hidden = false;
    pager('snapshot-keys', s);
  }

  // Snapshot versions, each downloadable: fetched with the key, handed over as a blob URL.

  async function loadVersions() {
    const s = state.snapshots;
    const card = $('#versions-card');
    const body = $('#version-table tbody');
    if (!s.key) {
      body.replaceChildren();
      $('#versions-card .empty').hidden = false;
      footer(null);
      return;
    }
    const current = ticket('versions');
    try {
      const page = await api(`v1/snapshots/${seg(s.key)}/versions?limit=1000`);
      if (!current()) return;
      const rows = page.items.map((v, i) => h('tr', { 'data-version': v.version },
        h('td', { class: 'num mono' }, String(v.version), i === 0 ? [' ', h('span', { class: 'badge current' }, 'current')] : null),
        h('td', { class: 'num', title: `${v.size} bytes` }, bytes(v.size)),
        h('td', { class: 'num mono' }, String(v.token)),
        h('td', { class: 'mono' }, v.etag.length > 22 ? `${v.etag.slice(0, 18)}…"` : v.etag),
        h('td', { class: 'mono' }, v.content_type),
        h('td', { class: 'nowrap' }, utc(v.updated_at)),
        h('td', {}, h('button', { type: 'button', class: 'quiet small', 'data-action': 'download', onclick: () => download(s.key, v) }, 'Download'))));
      for (const [i, row] of rows.entries()) row.cells[3].title = page.items[i].etag;
      body.replaceChildren(...rows);
      $('#versions-card .empty').hidden = rows.length > 0;
      setError($('.error', card), null);
    } catch (e) {
      if (!current()) return;
      body.replaceChildren();
      $('#versions-card .empty').hidden = true;
      setError($('.error', card), e.status === 404 ? new ApiFailure(404, { detail: `No snapshot of ${s.key} is stored (never written, or deleted).` }) : e);
    }
    $('#view-snapshots').dataset.loaded = String(Date.now());
  }

  async function download(key, v) {
    try {
      const response = await api(`v1/snapshots/${seg(key)}/versions/${v.version}`, { raw: true });
      const blob = await response.blob();
      const url = URL.createObjectURL(blob);
      const a = h('a', { href: url, download: fileName(key, v) });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60e3);
    } catch (e) {
      banner(`Could not download version ${v.version} of ${key}: ${e.message}`, true);
    }
  }

  function fileName(key, v) {
    const type = (v.content_type || '').split(';')[0].trim();
    const ext = { 'application/json': '.json', 'text/plain': '.txt', 'text/csv': '.csv' }[type] || '.bin';
    return `${key.replace(/[^A-Za-z0-9._-]+/g, '_')}.v${v.version}${ext}`;
  }

  // ---- Live parts -------------------------------------------------------------------------

  // Countdowns move every second between two reads of the API.
  function tick() {
    const t = now();
    for (const el of $$('.countdown[data-expires]')) {
      const left = Number(el.dataset.expires) - t;
      el.textContent = left > 0 ? `in ${duration(left)}` : 'expiring…';
      el.classList.toggle('soon', left < 10e3);
    }
    for (const el of $$('progress[data-expires]')) el.value = Math.max(0, Number(el.dataset.expires) - t);
    for (const el of $$('.since[data-since]')) el.textContent = `${duration(t - Number(el.dataset.since))} ago`;
  }

  function banner(text, bad) {
    const el = $('#banner');
    el.textContent = text;
    el.classList.toggle('bad', Boolean(bad));
    el.hidden = false;
    clearTimeout(banner.timer);
    banner.timer = setTimeout(() => { el.hidden = true; }, 12e3);
  }

  const loaders = {
    leases: loadLeases,
    refused: loadRefused,
    recovery: loadRecovery,
    snapshots: async () => { await loadSnapshotKeys(); await loadVersions(); },
  };

  // One refresh at a time; one asked for meanwhile (a new key, another view) runs right after.
  async function refresh() {
    if (state.busy) {
      state.again = true;
      return;
    }
    state.busy = true;
    try {
      do {
        state.again = false;
        await probeAccess();
        await loaders[state.view]();
        await loadRecoveryCount();
      } while (state.again);
    } finally {
      state.busy = false;
    }
  }

  // ---- The change stream --------------------------------------------------------------------

  // Follows GET /v1/watch for the whole service: each change (a grant, a release, an expiry, a
  // write, a refusal…) reads the open view again. The stream is read with the same fetch as every
  // call, so it carries the key in its header (an EventSource could not). It resumes after the
  // last change seen when the server ends it; while it fails (no server, a key that may not
  // watch every key), the page polls every 5 s and tries the stream again later.
  async function watch() {
    for (;;) {
      const abort = new AbortController();
      state.watch.abort = abort;
      try {
        const headers = { Accept: 'text/event-stream' };
        if (state.watch.lastId) headers['Last-Event-ID'] = state.watch.lastId;
        const response = await api('v1/watch', { raw: true, headers, signal: abort.signal });
        setWatchMode('live');
        state.watch.retryMs = WATCH_RETRY_MS;
        // What changed while there was no stream.
        refresh();
        const started = Date.now();
        await readStream(response.body.getReader());
        // The server ended the stream (its --max-watch, or a restart): resume at once, unless
        // it keeps ending them as soon as they start.
        if (Date.now() - started < 1000) throw new Error('the server ended the stream at once');
        continue;
      } catch (e) {
        if (abort.signal.aborted) continue; // a new key: start again with it
        setWatchMode('polling', e);
        await new Promise((resolve) => {
          state.watch.wake = resolve;
          setTimeout(resolve, state.watch.retryMs);
        });
        state.watch.retryMs = Math.min(state.watch.retryMs * 2, 60e3);
      }
    }
  }

  async function readStream(reader) {
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let id = null;
        let event = null;
        for (const line of block.split('\n')) {
          if (line.startsWith('id:')) id = line.slice(3).trim();
          else if (line.startsWith('event:')) event = line.slice(6).trim();
        }
        if (id) state.watch.lastId = id;
        if (event) changed();
      }
    }
  }

  // A change: read the open view again, once for the changes that come together.
  function changed() {
    state.watch.events += 1;
    document.body.dataset.watchEvents = String(state.watch.events);
    if (state.watch.batch) return;
    state.watch.batch = setTimeout(() => {
      state.watch.batch = null;
      refresh();
    }, WATCH_BATCH_MS);
  }

  function setWatchMode(mode, error) {
    state.watch.mode = mode;
    const el = $('#mode');
    el.dataset.mode = mode;
    el.textContent = mode === 'live'
      ? 'live: follows the server\'s changes'
      : `refreshes every 5 s (the change stream failed: ${error ? error.message : 'no answer'})`;
  }

  // A new key: the stream starts again with it, at once.
  function restartWatch() {
    if (state.watch.abort) state.watch.abort.abort();
    if (state.watch.wake) state.watch.wake();
  }

  // ---- Navigation ---------------------------------------------------------------------------

  function route() {
    let hash = location.hash.replace(/^#/, '');
    try { hash = decodeURIComponent(hash); } catch (_) { /* a hand-made hash: use it as it is */ }
    const [view, ...rest] = hash.split('/');
    state.view = view in loaders ? view : 'leases';
    if (state.view === 'snapshots' && rest.length) {
      state.snapshots.key = rest.join('/');
      $('#snapshot-form').elements.key.value = state.snapshots.key;
    }
    for (const section of $$('.view')) section.hidden = section.id !== `view-${state.view}`;
    for (const tab of $$('.tabs a')) tab.classList.toggle('active', tab.dataset.view === state.view);
    refresh();
  }

  function wire() {
    $('#key-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const input = $('#api-key');
      const key = input.value.trim();
      input.value = '';
      if (key) sessionStorage.setItem(KEY_STORAGE, key);
      refresh();
      restartWatch();
    });
    $('#forget-key').addEventListener('click', () => {
      sessionStorage.removeItem(KEY_STORAGE);
      refresh();
      restartWatch();
    });

    $('#lease-filter').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const f = ev.target.elements;
      Object.assign(state.leases, { prefix: f.prefix.value, state: f.state.value, cursors: [null], page: 0, confirm: null });
      loadLeases();
    });
    $('#lease-filter select[name="state"]').addEventListener('change', () => $('#lease-filter').requestSubmit());

    $('#chart-filter').addEventListener('submit', (ev) => ev.preventDefault());
    $('#chart-filter select[name="window"]').addEventListener('change', (ev) => {
      state.chart.window = ev.target.value;
      loadChart();
    });
    $('#chart-filter input[name="prefix"]').addEventListener('input', (ev) => {
      state.chart.prefix = ev.target.value;
      drawChart();
    });
    $('#chart-filter select[name="principal"]').addEventListener('change', (ev) => {
      state.chart.principal = ev.target.value;
      drawChart();
    });

    $('#audit-filter').addEventListener('submit', (ev) => {
      ev.preventDefault();
      applyAuditFilters();
    });
    $('#audit-filter').addEventListener('reset', () => setTimeout(applyAuditFilters, 0));

    $('#snapshot-keys-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      Object.assign(state.snapshots, { prefix: ev.target.elements.prefix.value, cursors: [null], page: 0 });
      loadSnapshotKeys();
    });

    $('#snapshot-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const key = ev.target.elements.key.value;
      location.hash = `snapshots/${seg(key)}`;
    });

    const paged = {
      leases: [state.leases, loadLeases],
      refused: [state.audit, loadAudit],
      recovery: [state.recovery, loadRecovery],
      'snapshot-keys': [state.snapshots, loadSnapshotKeys],
    };
    for (const el of $$('.pager')) {
      const [s, load] = paged[el.dataset.for];
      el.querySelector('[data-page="first"]').addEventListener('click', () => { s.page = 0; s.cursors = [null]; load(); });
      el.querySelector('[data-page="next"]').addEventListener('click', () => {
        if (!s.next) return;
        s.cursors[s.page + 1] = s.next;
        s.page += 1;
        load();
      });
    }

    window.addEventListener('hashchange', route);
    let resizing = null;
    window.addEventListener('resize', () => {
      clearTimeout(resizing);
      resizing = setTimeout(() => { if (state.chart.since) drawChart(); }, 150);
    });
    document.addEventListener('visibilitychange', () => { if (!document.hidden) refresh(); });
    // Polling only while the change stream fails.
    setInterval(() => {
      if (document.hidden || state.watch.mode === 'live') return;
      state.watch.polls += 1;
      document.body.dataset.polls = String(state.watch.polls);
      refresh();
    }, REFRESH_MS);
    // The queues of held keys, which the stream says nothing of (see the top of this file).
    setInterval(() => {
      if (document.hidden || state.watch.mode !== 'live' || state.view !== 'leases') return;
      if (!$('#lease-table tr[data-state="held"]')) return;
      state.queueReads += 1;
      document.body.dataset.queueReads = String(state.queueReads);
      loadLeases();
    }, REFRESH_MS);
    setInterval(tick, 1000);
  }

  wire();
  route();
  watch();
})();
