#!/usr/bin/env node
// Checks the live page in headless Chromium, as a person would use it, against a running
// server (the tailrace binary or server/static-dev/mock_server.py):
//
//   node server/static-dev/check_page.mjs BASE_URL SCREENSHOT.png [--soak SECONDS]
//
// It loads `/`, asserts that every chart has data and advances within 2 s, that the newest
// events are listed (bounded, newest first, data shown as text), narrows the list with a
// filter, shows the server's message for an invalid one, drops the connections and checks
// that both streams resume after their last id with no duplicate and no missing event, that
// reconnecting adds no listeners, asks the stored window questions in the question box (a
// table, a chart of a time-bucketed answer, the server's 400 for a stage outside the subset),
// and that the console stayed free of errors and warnings.
// It writes SCREENSHOT.png (light) and SCREENSHOT-dark.png (dark). Exit status 0 = all passed;
// otherwise the first failed assertion is printed, with a screenshot of that moment.
//
// Needs `playwright-core` (npm) resolvable from the current directory or NODE_PATH; it drives
// Debian's /usr/bin/chromium (override with CHROMIUM=/path); it downloads no browser.
//
// --soak SECONDS then keeps the page open that long, sampling heap, DOM nodes, listeners and
// frame delay every 30 s, and fails if any of them grows without bound.
//
// Every request that leaves the page's origin is aborted and counted; any is a failure (the
// page must work offline).
//
// --map-fixture FILE checks the live map instead, against a server whose only source follows
// FILE (NDJSON; tailrace/tests/page.rs): the check appends events with known places to it and
// asserts that the land is drawn, that each known point's dot is centred within 1 px of its
// projected position, that the legend's and the country list's counts equal /metrics' once
// the source is quiet (also after a dropped connection), that a click on a country filters the
// list and the dots, and that a replay draws every stored placed event of its window.
//
// --measure-map SECONDS keeps the page open that long against a busy server (1,000 events/s)
// and measures the frame time and the JavaScript heap; it fails above 16 ms (p95) or 5 MB, and
// writes SCREENSHOT.png of the map.

import { createRequire } from 'node:module';
import { appendFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const started = Date.now();
const args = process.argv.slice(2);
const soakAt = args.indexOf('--soak');
const soakSeconds = soakAt >= 0 ? Number(args.splice(soakAt, 2)[1]) : 0;
const fixtureAt = args.indexOf('--map-fixture');
const fixturePath = fixtureAt >= 0 ? args.splice(fixtureAt, 2)[1] : null;
const measureAt = args.indexOf('--measure-map');
const measureSeconds = measureAt >= 0 ? Number(args.splice(measureAt, 2)[1]) : 0;
if (
  args.length !== 2 ||
  !/^https?:\/\//.test(args[0]) ||
  !Number.isFinite(soakSeconds) ||
  !Number.isFinite(measureSeconds) ||
  (fixtureAt >= 0 && !fixturePath)
) {
  console.error(
    'usage: node check_page.mjs BASE_URL SCREENSHOT.png [--soak SECONDS | --map-fixture FILE | --measure-map SECONDS]',
  );
  process.exit(2);
}
const base = args[0].replace(/\/+$/, '');
const shotPath = path.resolve(args[1]);
const darkShotPath = shotPath.replace(/(\.png)?$/i, '-dark.png');

class CheckFailed extends Error {}

/** Fails the check with a message that says what was expected and what was seen. */
function assert(cond, message) {
  if (!cond) throw new CheckFailed(message);
}

function loadPlaywright() {
  const here = path.dirname(fileURLToPath(import.meta.url));
  for (const dir of [process.cwd(), here]) {
    try {
      return createRequire(path.join(dir, 'noop.js'))('playwright-core');
    } catch {
      // try the next place
    }
  }
  console.error(
    'FAIL: cannot load playwright-core. Install it in a scratch directory and run from there:\n' +
      '  mkdir -p /tmp/pw && cd /tmp/pw && npm install playwright-core\n' +
      `  node ${fileURLToPath(import.meta.url)} ${base} ${shotPath}`,
  );
  process.exit(2);
}

const { chromium } = loadPlaywright();
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
const userDataDir = mkdtempSync(path.join(tmpdir(), 'tailrace-check-'));

const problems = []; // console errors, page errors, failed requests
const expectedBad = []; // URL parts of requests the check makes fail on purpose
const isExpectedBad = (url) => expectedBad.some((part) => url.includes(part));
const changeRequests = []; // {url, lastEventId}

const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath,
  headless: true,
  viewport: { width: 1440, height: 960 },
  colorScheme: 'light',
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
});
const page = context.pages()[0] || (await context.newPage());

// Offline: whatever would leave the page's origin is aborted here, and counted.
const origin = new URL(base).origin;
const external = [];
await context.route(
  (url) => url.origin !== origin,
  (route) => {
    external.push(route.request().url());
    return route.abort('blockedbyclient');
  },
);

page.on('console', (m) => {
  if (m.type() !== 'error' && m.type() !== 'warning') return;
  const url = m.location() && m.location().url;
  if (url && isExpectedBad(url)) return; // Chromium's "Failed to load resource: 400" of a bad filter
  problems.push(`console ${m.type()}: ${m.text()}${url ? ` (${url})` : ''}`);
});
page.on('pageerror', (e) => problems.push(`uncaught exception: ${e.message}`));
page.on('requestfailed', (r) => {
  const why = r.failure() ? r.failure().errorText : 'unknown';
  // The page aborts streams on purpose (filter swap, drop): that is not a failure.
  if (why !== 'net::ERR_ABORTED') problems.push(`request failed: ${r.url()}: ${why}`);
});
page.on('response', (r) => {
  if (r.status() >= 400 && !isExpectedBad(r.url())) problems.push(`HTTP ${r.status()} for ${r.url()}`);
});
page.on('request', (r) => {
  if (r.url().includes('/api/changes')) {
    changeRequests.push({ url: r.url(), lastEventId: r.headers()['last-event-id'] ?? null });
  }
});

const cdp = await context.newCDPSession(page);

/** Polls `fn` in the page until it returns a truthy value; fails with `what` after `ms`. */
async function waitFor(what, ms, fn, arg) {
  try {
    const handle = await page.waitForFunction(fn, arg, { timeout: ms, polling: 50 });
    return await handle.jsonValue();
  } catch (e) {
    if (e && e.name === 'TimeoutError') throw new CheckFailed(`${what}: not within ${ms} ms`);
    throw e;
  }
}

const snapshot = () => page.evaluate(() => window.tailrace.snapshot());

let lastTask = null;
async function counters() {
  await cdp.send('HeapProfiler.collectGarbage');
  const dom = await cdp.send('Memory.getDOMCounters');
  const { metrics } = await cdp.send('Performance.getMetrics');
  const m = Object.fromEntries(metrics.map((x) => [x.name, x.value]));
  const frameMs = await page.evaluate(async () => {
    const t = performance.now();
    await new Promise((r) => requestAnimationFrame(() => r()));
    return performance.now() - t;
  });
  // Main-thread busy share since the previous sample: what the page costs the operator's
  // machine (TaskDuration is cumulative seconds of main-thread work).
  const wall = performance.now() / 1000;
  const busy = lastTask ? (m.TaskDuration - lastTask.task) / (wall - lastTask.wall) : null;
  lastTask = { task: m.TaskDuration, wall };
  const points = await page.evaluate(() => window.tailrace.snapshot().points);
  return {
    busyPct: busy === null ? null : +(busy * 100).toFixed(1),
    points: Object.values(points).join('/'),
    heapMB: +(m.JSHeapUsedSize / 1048576).toFixed(1),
    nodes: dom.nodes,
    listeners: dom.jsEventListeners,
    documents: dom.documents,
    frameMs: +frameMs.toFixed(1),
  };
}

let stepNo = 0;
async function step(name, fn) {
  const t = Date.now();
  stepNo++;
  const result = await fn();
  const extra = result ? ` — ${result}` : '';
  console.log(`ok ${stepNo} - ${name} (${Date.now() - t} ms)${extra}`);
  assert(external.length === 0, `no request outside ${origin} during "${name}"; saw ${external.join(', ')}`);
  assert(problems.length === 0, `console/network problems during "${name}":\n  ${problems.join('\n  ')}`);
}

const CHARTS = ['chart-rate', 'chart-notify', 'chart-write'];

async function run() {
  await cdp.send('Performance.enable');

  await step('the page loads and the header shows the server', async () => {
    const res = await page.goto(`${base}/`, { waitUntil: 'load' });
    assert(res && res.ok(), `GET / answered ${res && res.status()}`);
    const info = await waitFor(
      'the header filled from /api/status',
      10000,
      () => {
        const t = (id) => document.getElementById(id).textContent.trim();
        const v = ['info-version', 'info-engine', 'info-durability', 'info-sources', 'info-feeds'].map(t);
        return v.every((x) => x && x !== '…' && x !== '?') && v;
      },
    );
    await waitFor('the connection indicator to say live', 10000, () => document.getElementById('conn').dataset.state === 'live');
    return `version ${info[0]}, engine ${info[1]}, durability ${info[2]}, feeds ${info[4]}`;
  });

  await step('every chart has data and advances within 2 s', async () => {
    const out = [];
    for (const id of CHARTS) {
      const first = await waitFor(
        `#${id} to have 2 points`,
        20000,
        (id) => {
          const e = document.getElementById(id);
          return Number(e.dataset.points) >= 2 && e.querySelector('canvas') && { x: Number(e.dataset.lastX), n: Number(e.dataset.points) };
        },
        id,
      );
      out.push({ id, ...first });
    }
    // All charts at once: each must move past the x it had.
    await Promise.all(
      out.map((c) =>
        waitFor(`#${c.id} to advance past x=${c.x}`, 2000, ([id, x]) => Number(document.getElementById(id).dataset.lastX) > x, [c.id, c.x]),
      ),
    );
    const lens = await page.evaluate((ids) => ids.map((id) => document.getElementById(id).dataset.points), CHARTS);
    return CHARTS.map((id, i) => `${id} ${lens[i]} points`).join(', ');
  });

  await step('the newest events are listed, newest first, as text, bounded', async () => {
    await waitFor('20 events in #events', 10000, () => document.querySelectorAll('#events > li').length >= 20);
    // Let the live stream run so that more than the bound has arrived.
    await waitFor('more than 100 events received', 15000, () => window.tailrace.snapshot().events.received > 150);
    const r = await page.evaluate(() => {
      const lis = [...document.querySelectorAll('#events > li')];
      const allowed = new Set(['LI', 'DETAILS', 'SUMMARY', 'TIME', 'SPAN', 'BDI', 'PRE']);
      const foreign = [...document.querySelectorAll('#events *')].filter((e) => !allowed.has(e.tagName)).map((e) => e.tagName);
      const orders = lis.map((li) => Number(li.dataset.order));
      const unordered = orders.findIndex((o, i) => i > 0 && o > orders[i - 1]);
      const noAuto = lis.filter((li) => li.querySelector('.text').getAttribute('dir') !== 'auto').length;
      const keys = new Set(lis.map((li) => li.dataset.key));
      const markup = lis.filter((li) => /<[a-z/]/i.test(li.querySelector('.text').textContent)).length;
      return { n: lis.length, foreign, unordered, noAuto, unique: keys.size, markup };
    });
    assert(r.n <= 100, `at most 100 events in the DOM; saw ${r.n}`);
    assert(r.foreign.length === 0, `only the page's own elements in #events; saw ${[...new Set(r.foreign)].join(', ')}`);
    assert(r.unordered < 0, `events newest first; item ${r.unordered} is newer than the one above it`);
    assert(r.noAuto === 0, `every event text has dir="auto"; ${r.noAuto} do not`);
    assert(r.unique === r.n, `one li per event; ${r.n - r.unique} keys repeat`);
    return `${r.n} shown${r.markup ? `, ${r.markup} with HTML-like text shown as text` : ''}`;
  });

  await step('opening an event shows its whole document, ids exact', async () => {
    await page.click('#pause');
    const li = page.locator('#events > li').first();
    await li.locator('summary').click();
    const text = await li.locator('pre').textContent({ timeout: 2000 });
    let doc;
    try {
      doc = JSON.parse(text);
    } catch (e) {
      throw new CheckFailed(`the opened event shows JSON; saw ${JSON.stringify(text.slice(0, 200))}: ${e.message}`);
    }
    assert(doc && typeof doc === 'object', `an object document; saw ${text.slice(0, 200)}`);
    if (typeof doc.id_str === 'string' && /^\d{17,}$/.test(doc.id_str)) {
      // JSON.parse here rounds like the page would have without JSON.rawJSON: compare text.
      assert(new RegExp(`"id": ${doc.id_str}\\b`).test(text), `the id is shown exactly as ${doc.id_str}; saw ${text.match(/"id": \d+/)}`);
    }
    await li.locator('summary').click();
    await page.click('#pause');
    const pressed = await page.getAttribute('#pause', 'aria-pressed');
    assert(pressed === 'false', `the list runs again after Resume; aria-pressed=${pressed}`);
    return `${text.length} characters of JSON`;
  });

  await step('the feeds and top-k tables have rows', async () => {
    const n = await waitFor('rows in #feeds and #topk', 10000, () => {
      const f = document.querySelectorAll('#feeds tbody tr').length;
      const t = document.querySelectorAll('#topk tbody tr').length;
      return f > 0 && t > 0 && [f, t];
    });
    return `${n[0]} feeds, top ${n[1]}`;
  });

  await step('the map draws the land and counts placed events, offline', async () => {
    await waitFor('the map ready', 10000, () => document.getElementById('map-wrap').dataset.ready === 'true');
    const land = await landCheck();
    const counts = await waitFor('counts in the legend', 10000, () => {
      const m = window.tailrace.snapshot().map;
      return m.counts && Object.values(m.counts).reduce((a, b) => a + b, 0) > 0 && m.counts;
    });
    await waitFor('a dot on the map', 10000, () => window.tailrace.snapshot().map.drawn > 0);
    assert(external.length === 0, `no request outside ${origin}; saw ${external.join(', ')}`);
    return `${land}; counts ${JSON.stringify(counts)}`;
  });

  let lang = '';
  await step('a filter narrows the list', async () => {
    const langs = await page.evaluate(() => [...document.querySelectorAll('#events > li')].map((li) => li.dataset.lang));
    const count = new Map();
    for (const l of langs) if (l) count.set(l, (count.get(l) || 0) + 1);
    assert(count.size > 0, `events carry a lang to filter on; saw ${JSON.stringify(langs.slice(0, 5))}`);
    // The most common language that is not every event's, so narrowing is visible.
    const sorted = [...count].sort((a, b) => b[1] - a[1]);
    lang = (sorted.find(([, n]) => n < langs.length) || sorted[0])[0];
    const filter = JSON.stringify({ lang });
    await page.fill('#filter', filter);
    await page.press('#filter', 'Enter');
    const n = await waitFor(
      `only lang ${lang} events listed`,
      10000,
      ([filter, lang]) => {
        const s = window.tailrace.snapshot().events;
        const lis = [...document.querySelectorAll('#events > li')];
        return s.filter === filter && lis.length > 0 && lis.every((li) => li.dataset.lang === lang) && lis.length;
      },
      [filter, lang],
    );
    const url = new URL(page.url());
    assert(url.searchParams.get('filter') === filter, `the filter kept in the page URL; saw ${page.url()}`);
    return `${filter}: ${n} events, was ${langs.length} mixed`;
  });

  await step('malformed JSON is caught in the page, before any request', async () => {
    const before = changeRequests.length;
    await page.fill('#filter', '{"lang": ');
    await page.press('#filter', 'Enter');
    const msg = await waitFor('a message in #filter-error', 2000, () => document.getElementById('filter-error').textContent.trim());
    assert(/JSON/.test(msg), `the error says it is not JSON; saw ${JSON.stringify(msg)}`);
    assert(changeRequests.length === before, `no request for malformed JSON; saw ${changeRequests.length - before}`);
    return JSON.stringify(msg);
  });

  await step("an invalid filter shows the server's 400 message and keeps the current list", async () => {
    const bad = '{"$and":[{"lang":{"$definitelyNotAnOperator":1}}]}';
    const badPart = `filter=${encodeURIComponent(bad)}`;
    expectedBad.push(badPart);
    const answered = page.waitForResponse((r) => r.url().includes('/api/changes?') && r.url().includes(badPart), { timeout: 5000 });
    await page.fill('#filter', bad);
    await page.press('#filter', 'Enter');
    const res = await answered.catch(() => null);
    assert(res, `a request to /api/changes with ${badPart}`);
    assert(res.status() === 400, `HTTP 400 for the invalid filter; saw ${res.status()}`);
    const body = await res.json().catch(() => ({}));
    const msg = await waitFor('the server message in #filter-error', 5000, () => document.getElementById('filter-error').textContent.trim());
    assert(msg === body.error, `#filter-error shows the server's message ${JSON.stringify(body.error)}; saw ${JSON.stringify(msg)}`);
    const invalid = await page.getAttribute('#filter', 'aria-invalid');
    assert(invalid === 'true', `the box is marked invalid; aria-invalid=${invalid}`);
    const s = await snapshot();
    assert(s.events.filter === JSON.stringify({ lang }), `the previous filter still applies; saw ${JSON.stringify(s.events.filter)}`);
    const still = await page.evaluate((lang) => [...document.querySelectorAll('#events > li')].every((li) => li.dataset.lang === lang), lang);
    assert(still, 'the list still shows the previous filter only');
    return JSON.stringify(msg);
  });

  await step('an empty filter shows everything again', async () => {
    await page.fill('#filter', '');
    await page.press('#filter', 'Enter');
    await waitFor('the unfiltered stream', 10000, () => {
      const s = window.tailrace.snapshot().events;
      return s.filter === '' && document.getElementById('filter-error').textContent === '' && document.querySelectorAll('#events > li').length >= 20;
    });
    const url = new URL(page.url());
    assert(!url.searchParams.has('filter'), `no filter in the page URL; saw ${page.url()}`);
  });

  await step('after a dropped connection both streams resume after their last id', async () => {
    // Let some events arrive on the unfiltered stream first.
    await page.waitForTimeout(1000);
    const before = await snapshot();
    const reqsBefore = changeRequests.length;
    const ids = await page.evaluate(() => {
      const s = window.tailrace.snapshot();
      window.tailrace.drop();
      return { stats: s.stats.lastEventId, events: s.events.lastEventId, map: s.map.lastEventId };
    });
    assert(ids.stats && ids.events, `both streams had an id to resume from; saw ${JSON.stringify(ids)}`);
    // The map's stream reconnects on its own schedule: wait for it too before reading its
    // request, or the check races it.
    await waitFor(
      'every stream reconnected and live',
      10000,
      ([s0, e0, m0]) => {
        const s = window.tailrace.snapshot();
        return (
          s.stats.connections > s0 &&
          s.events.connections > e0 &&
          s.map.connections > m0 &&
          document.getElementById('conn').dataset.state === 'live'
        );
      },
      [before.stats.connections, before.events.connections, before.map.connections],
    );
    const resumed = changeRequests.slice(reqsBefore);
    const statsReq = resumed.find((r) => r.url.includes('collection=stats'));
    // The list's stream; the map's own (initial_limit=1) is checked below.
    const eventsReq = resumed.find((r) => r.url.includes('collection=events') && !/initial_limit=1(&|$)/.test(r.url));
    const mapReq = resumed.find((r) => /collection=events.*initial_limit=1(&|$)/.test(r.url));
    assert(statsReq && statsReq.lastEventId === ids.stats, `stats resumed with Last-Event-ID ${ids.stats}; saw ${JSON.stringify(statsReq)}`);
    assert(eventsReq && eventsReq.lastEventId === ids.events, `events resumed with Last-Event-ID ${ids.events}; saw ${JSON.stringify(eventsReq)}`);
    assert(mapReq && mapReq.lastEventId === ids.map, `the map's events resumed with Last-Event-ID ${ids.map}; saw ${JSON.stringify(mapReq)}`);
    const r0 = (await snapshot()).events.received;
    await waitFor('events after the reconnect', 5000, (r0) => window.tailrace.snapshot().events.received > r0 + 20, r0);
    const after = await snapshot();
    assert(after.events.duplicates === 0, `no event delivered twice; saw ${after.events.duplicates} duplicates`);
    assert(after.events.seqGaps === 0, `no event missed (contiguous _tailrace.seq); saw ${after.events.seqGaps} missing`);
    assert(after.events.gaps === 0, `no gap reported; saw ${after.events.gaps}`);
    return `resumed after stats ${ids.stats}, events ${ids.events}, map ${ids.map}`;
  });

  await step('reconnecting adds no listeners or nodes', async () => {
    const c0 = await counters();
    for (let i = 0; i < 5; i++) {
      const before = await snapshot();
      await page.evaluate(() => window.tailrace.drop());
      await waitFor(
        `reconnect ${i + 1}`,
        10000,
        (e0) => window.tailrace.snapshot().events.connections > e0 && document.getElementById('conn').dataset.state === 'live',
        before.events.connections,
      );
    }
    await page.waitForTimeout(1500);
    const c1 = await counters();
    const s = await snapshot();
    assert(c1.listeners <= c0.listeners + 2, `listeners after 5 reconnects: ${c0.listeners} → ${c1.listeners}`);
    assert(c1.nodes <= c0.nodes * 1.3 + 500, `DOM nodes after 5 reconnects: ${c0.nodes} → ${c1.nodes}`);
    assert(s.events.duplicates === 0 && s.events.seqGaps === 0, `exact resume on every reconnect; saw ${JSON.stringify(s.events)}`);
    return `listeners ${c0.listeners} → ${c1.listeners}, nodes ${c0.nodes} → ${c1.nodes}, heap ${c0.heapMB} → ${c1.heapMB} MB`;
  });

  await step('the question box answers as a table, with what it read and where it ran', async () => {
    await page.click('button.query-example >> text=by language');
    const meta = await waitFor('an answer in #query-meta', 10000, () => {
      const t = document.getElementById('query-meta').textContent;
      return /rows · read \d+ from events/.test(t) && t;
    });
    const table = await page.evaluate(() => ({
      head: [...document.querySelectorAll('#query-result thead th')].map((th) => th.textContent),
      rows: [...document.querySelectorAll('#query-result tbody tr')].map((tr) => [...tr.cells].map((td) => td.textContent)),
    }));
    assert(JSON.stringify(table.head) === '["_id","count"]', `columns _id and count; saw ${JSON.stringify(table.head)}`);
    assert(table.rows.length >= 2 && table.rows.length <= 10, `one row per language, at most 10; saw ${table.rows.length}`);
    const counts = table.rows.map((r) => Number(r[1]));
    assert(counts.every((c, i) => c > 0 && (i === 0 || c <= counts[i - 1])), `counts sorted, largest first; saw ${counts}`);
    assert(/\$sortByCount in tailrace/.test(meta), `the meta line says where each stage ran; saw ${JSON.stringify(meta)}`);
    return `${JSON.stringify(meta)}; ${table.rows.map((r) => r.join('=')).join(', ')}`;
  });

  await step('a time-bucketed question is drawn as a chart', async () => {
    const runs = (await snapshot()).query.runs;
    await page.click('button.query-example >> text=per 10 s');
    const points = await waitFor(
      'the chart of the answer',
      10000,
      (runs) => {
        const q = window.tailrace.snapshot().query;
        const node = document.getElementById('query-chart');
        return q.runs > runs && !node.hidden && node.querySelector('canvas') && q.chartPoints;
      },
      runs,
    );
    const first = await page.textContent('#query-result tbody tr td');
    assert(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d0\.000Z$/.test(first), `buckets of 10 s as dates; saw ${JSON.stringify(first)}`);
    return `${points} buckets, first ${first}`;
  });

  await step("a pipeline outside the subset shows the server's 400 message", async () => {
    expectedBad.push('/api/aggregate');
    try {
      const answered = page.waitForResponse((r) => r.url().endsWith('/api/aggregate'), { timeout: 5000 });
      await page.fill('#query', '[{"$lookup": {"from": "x"}}]');
      await page.click('#query-form button[type=submit]');
      const res = await answered;
      assert(res.status() === 400, `HTTP 400; saw ${res.status()}`);
      const msg = await waitFor('the message in #query-error', 5000, () => document.getElementById('query-error').textContent.trim());
      assert(/\$lookup is not supported/.test(msg), `the message names the stage; saw ${JSON.stringify(msg)}`);
      const invalid = await page.getAttribute('#query', 'aria-invalid');
      assert(invalid === 'true', `the box is marked invalid; aria-invalid=${invalid}`);
      return JSON.stringify(msg);
    } finally {
      expectedBad.pop();
    }
  });

  await step('a breakout of the rate is marked on its chart and named under it', async () => {
    // The test's source bursts (tailrace/tests/page.rs): the first burst after a calm window
    // breaks out of the band within about half a minute of the start.
    const said = await waitFor(
      'a breakout mark on #chart-rate',
      120000,
      () => Number(document.getElementById('chart-rate').dataset.marks) >= 1 && document.getElementById('trend-last').textContent,
    );
    assert(/^[▲▼] \S+'s rate broke out (up|down) at \d\d:\d\d:\d\d: /.test(said), `the newest breakout named; saw ${JSON.stringify(said)}`);
    // What the page marks is what the server stored.
    const stored = await page.evaluate(async () => {
      const r = await fetch('/api/aggregate', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ collection: 'trends', pipeline: [{ $match: { statistic: 'rate' } }, { $count: 'n' }] }),
      });
      const b = await r.json();
      return b.docs.length ? b.docs[0].n : 0;
    });
    const marked = (await snapshot()).trends.marks;
    assert(marked >= 1 && marked <= stored, `${marked} marked of ${stored} stored breakouts`);
    return `${JSON.stringify(said)}; ${marked} marked, ${stored} stored`;
  });

  await step('screenshots, light and dark', async () => {
    await page.screenshot({ path: shotPath, fullPage: true });
    await page.emulateMedia({ colorScheme: 'dark' });
    await page.waitForTimeout(1200); // a second of data with the rebuilt (dark) charts
    await page.screenshot({ path: darkShotPath, fullPage: true });
    await page.emulateMedia({ colorScheme: 'light' });
    return `${shotPath}, ${darkShotPath}`;
  });

  if (soakSeconds > 0) {
    await step(`soak for ${soakSeconds} s`, async () => {
      const samples = [await counters()];
      console.log(`  t=0s ${JSON.stringify(samples[0])}`);
      const until = Date.now() + soakSeconds * 1000;
      while (Date.now() < until) {
        await page.waitForTimeout(Math.min(30000, until - Date.now()));
        const c = await counters();
        samples.push(c);
        console.log(`  t=${Math.round((Date.now() - until) / 1000 + soakSeconds)}s ${JSON.stringify(c)}`);
      }
      const first = samples[1] || samples[0];
      const last = samples[samples.length - 1];
      const s = await snapshot();
      assert(last.heapMB <= first.heapMB * 1.5 + 5, `JS heap bounded: ${first.heapMB} → ${last.heapMB} MB`);
      assert(last.nodes <= first.nodes * 1.3 + 500, `DOM nodes bounded: ${first.nodes} → ${last.nodes}`);
      assert(last.listeners <= first.listeners + 2, `listeners bounded: ${first.listeners} → ${last.listeners}`);
      assert(Math.max(...samples.map((x) => x.frameMs)) < 200, `a frame within 200 ms; saw ${samples.map((x) => x.frameMs)}`);
      const busy = samples.slice(1).map((x) => x.busyPct);
      const meanBusy = busy.length ? (busy.reduce((a, b) => a + b, 0) / busy.length).toFixed(1) : '?';
      return `${s.events.received} events received, heap ${first.heapMB} → ${last.heapMB} MB, nodes ${first.nodes} → ${last.nodes}, main thread busy ${meanBusy}% on average`;
    });
  }
}

// ---------------------------------------------------------------------------------------------
// The map

/** The map's projection, computed here independently of map.js: canvas pixels of a place. */
function projected(lon, lat, width, height) {
  return [((lon + 180) / 360) * width, ((90 - lat) / 180) * height];
}

/**
 * Reads a square of `radius` around a place on one of the map's canvases, through a copy (one
 * read-back per canvas, so Chromium has no reason to warn): the pixel there, and the
 * alpha-weighted centre of what is drawn in the square.
 */
async function readMap(id, lon, lat, radius = 0) {
  return page.evaluate(
    ([id, lon, lat, radius]) => {
      const c = document.getElementById(id);
      const ex = ((lon + 180) / 360) * c.width;
      const ey = ((90 - lat) / 180) * c.height;
      const x0 = Math.floor(ex) - radius;
      const y0 = Math.floor(ey) - radius;
      const n = 2 * radius + 1;
      const copy = document.createElement('canvas');
      copy.width = n;
      copy.height = n;
      const ctx = copy.getContext('2d');
      ctx.drawImage(c, x0, y0, n, n, 0, 0, n, n);
      const d = ctx.getImageData(0, 0, n, n).data;
      let mass = 0;
      let sx = 0;
      let sy = 0;
      for (let j = 0; j < n; j++) {
        for (let i = 0; i < n; i++) {
          const a = d[(j * n + i) * 4 + 3];
          mass += a;
          sx += a * (x0 + i + 0.5);
          sy += a * (y0 + j + 0.5);
        }
      }
      const k = (radius * n + radius) * 4;
      return { ex, ey, mass, cx: mass ? sx / mass : null, cy: mass ? sy / mass : null, rgba: [...d.slice(k, k + 4)], width: c.width, height: c.height };
    },
    [id, lon, lat, radius],
  );
}

/** `#rrggbb` of a CSS custom property as [r, g, b]. */
async function cssColor(name) {
  const hex = await page.evaluate((n) => getComputedStyle(document.documentElement).getPropertyValue(n).trim(), name);
  const m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(hex);
  assert(m, `${name} is a #rrggbb colour; saw ${JSON.stringify(hex)}`);
  return [1, 2, 3].map((i) => parseInt(m[i], 16));
}

const near = (a, b) => a.every((v, i) => Math.abs(v - b[i]) <= 2);

/** Central Africa is land and the middle of the Pacific is sea, in the page's own colours. */
async function landCheck() {
  const [land, ocean] = [await cssColor('--land'), await cssColor('--ocean')];
  const places = [
    ['central Africa', 21, 4, land],
    ['Brazil', -50, -10, land],
    ['Siberia', 100, 62, land],
    ['the mid-Pacific', -140, 0, ocean],
    ['the South Atlantic', -20, -30, ocean],
  ];
  for (const [name, lon, lat, want] of places) {
    const p = await readMap('map-land', lon, lat);
    assert(near(p.rgba.slice(0, 3), want) && p.rgba[3] === 255, `${name} (${lon}, ${lat}) drawn as ${want}; saw ${p.rgba}`);
  }
  return `land ${land}, sea ${ocean} where they belong`;
}

/** Parses the Prometheus text of /metrics into name{labels} → value for two families. */
async function geoMetrics() {
  const text = await (await fetch(`${base}/metrics`)).text();
  const out = { precision: {}, country: {} };
  for (const line of text.split('\n')) {
    const m = /^tailrace_events_geo_(total|country_total)\{(precision|country)="([^"]*)"\} (\S+)$/.exec(line);
    if (m) out[m[2]][m[3]] = Number(m[4]);
  }
  return out;
}

/** What the page shows: the legend's numbers and the country list's rows, read from the DOM. */
async function shownCounts() {
  return page.evaluate(() => {
    const n = (id) => Number(document.getElementById(id).textContent.replace(/,/g, ''));
    const precision = {};
    for (const p of ['point', 'place', 'country', 'language', 'none']) precision[p] = n(`map-count-${p}`);
    const country = {};
    for (const tr of document.querySelectorAll('#map-countries tbody tr')) {
      country[tr.dataset.country] = Number(tr.cells[2].textContent.replace(/,/g, ''));
    }
    return { precision, country, total: n('map-total') };
  });
}

/**
 * Waits until the source is quiet (/metrics has counted all `written` events), then until the
 * page shows /metrics' numbers: every precision, the total, every listed country.
 */
async function countsMatchMetrics(written) {
  const deadline = Date.now() + 15000;
  let m;
  for (;;) {
    m = await geoMetrics();
    const total = Object.values(m.precision).reduce((a, b) => a + b, 0);
    if (total === written) break;
    assert(total < written && Date.now() < deadline, `/metrics counts the ${written} events written; saw ${total}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  let shown;
  const same = () =>
    Object.keys(m.precision).every((p) => shown.precision[p] === m.precision[p]) &&
    shown.total === written &&
    Object.entries(shown.country).every(([c, v]) => m.country[c] === v);
  const until = Date.now() + 5000;
  for (;;) {
    shown = await shownCounts();
    if (same()) break;
    assert(Date.now() < until, `the legend shows /metrics' counts ${JSON.stringify(m)}; saw ${JSON.stringify(shown)}`);
    await page.waitForTimeout(100);
  }
  // Every country /metrics counts is listed (the fixture has fewer than the list's ten).
  const missing = Object.keys(m.country).filter((c) => m.country[c] > 0 && !(c in shown.country));
  assert(missing.length === 0, `every counted country listed; missing ${missing}`);
  return shown;
}

/** Events with known places, and the precision and country each must be stamped with. */
const KNOWN_POINTS = [
  // Open sea, far from any country's point and from each other.
  [-140, 10],
  [-30.5, -35.25],
  [75, -20],
  [-20.125, 45.5],
];
let fixtureSeq = 0;
const fixtureWritten = { precision: {}, country: {}, n: 0 };

function fixture(kind, extra = {}) {
  fixtureSeq++;
  const doc = { id: fixtureSeq, text: `fixture ${fixtureSeq} (${kind})`, ...extra };
  return doc;
}

/** Appends events to the followed file; counts what each must be stamped with. */
function appendFixtures(events) {
  appendFileSync(fixturePath, events.map(([doc]) => JSON.stringify(doc) + '\n').join(''));
  for (const [, precision, country] of events) {
    fixtureWritten.precision[precision] = (fixtureWritten.precision[precision] || 0) + 1;
    fixtureWritten.country[country] = (fixtureWritten.country[country] || 0) + 1;
    fixtureWritten.n++;
  }
}

function firstFixtures() {
  const sydney = { type: 'Polygon', coordinates: [[[150.5, -34.2], [151.4, -34.2], [151.4, -33.5], [150.5, -33.5], [150.5, -34.2]]] };
  const events = [];
  for (const [lon, lat] of KNOWN_POINTS) events.push([fixture('point', { coordinates: { type: 'Point', coordinates: [lon, lat] } }), 'point', 'none']);
  // A point in Tokyo with its country: a JP dot of its own precision.
  events.push([fixture('point', { coordinates: { type: 'Point', coordinates: [139.69, 35.69] }, place: { country_code: 'JP' } }), 'point', 'JP']);
  for (let i = 0; i < 2; i++) events.push([fixture('place', { place: { bounding_box: sydney, country_code: 'AU' } }), 'place', 'AU']);
  for (let i = 0; i < 5; i++) events.push([fixture('country', { place: { country_code: 'JP' } }), 'country', 'JP']);
  for (let i = 0; i < 3; i++) events.push([fixture('country', { place: { country_code: 'BR' } }), 'country', 'BR']);
  for (let i = 0; i < 4; i++) events.push([fixture('language', { lang: 'fr' }), 'language', 'FR']);
  for (let i = 0; i < 2; i++) events.push([fixture('language', { lang: 'ja' }), 'language', 'JP']);
  for (let i = 0; i < 3; i++) events.push([fixture('none', { lang: 42 }), 'none', 'none']);
  return events;
}

/** The centre of the dot at a known point, within 1 px of where the projection puts it. */
async function dotAt(lon, lat) {
  const d = await readMap('map-dots', lon, lat, 12);
  assert(d.mass > 0, `a dot at (${lon}, ${lat}), pixel (${d.ex.toFixed(2)}, ${d.ey.toFixed(2)}); saw nothing within 12 px`);
  const [ex, ey] = projected(lon, lat, d.width, d.height);
  const off = Math.hypot(d.cx - ex, d.cy - ey);
  assert(off <= 1, `the dot of (${lon}, ${lat}) centred at (${ex.toFixed(2)}, ${ey.toFixed(2)}) ± 1 px; its centre is (${d.cx.toFixed(2)}, ${d.cy.toFixed(2)}), ${off.toFixed(2)} px off`);
  return off;
}

async function runMap() {
  await cdp.send('Performance.enable');
  await step('the map loads and draws the land, offline', async () => {
    const res = await page.goto(`${base}/`, { waitUntil: 'load' });
    assert(res && res.ok(), `GET / answered ${res && res.status()}`);
    await waitFor('the map ready', 10000, () => document.getElementById('map-wrap').dataset.ready === 'true');
    await waitFor('the map counts read from /api/geo', 10000, () => window.tailrace.snapshot().map.snapshots > 0);
    const land = await landCheck();
    assert(external.length === 0, `no request outside ${origin}; saw ${external.join(', ')}`);
    return land;
  });

  await step('known points land within 1 px of their projected position', async () => {
    appendFixtures(firstFixtures());
    const offs = [];
    for (const [lon, lat] of KNOWN_POINTS) {
      await waitFor(`a dot at (${lon}, ${lat})`, 10000, () => window.tailrace.snapshot().map.drawn >= 4);
      offs.push((await dotAt(lon, lat)).toFixed(2));
    }
    // Where nothing was placed, nothing is drawn.
    const empty = await readMap('map-dots', -100, -50, 12);
    assert(empty.mass === 0, `no dot in the empty South Pacific; saw alpha ${empty.mass}`);
    return `${KNOWN_POINTS.length} points, off by ${offs.join(', ')} px`;
  });

  await step("the legend's counts equal /metrics' once the source is quiet", async () => {
    const shown = await countsMatchMetrics(fixtureWritten.n);
    // And /metrics counted what the fixture says each event is.
    for (const [p, v] of Object.entries(fixtureWritten.precision)) assert(shown.precision[p] === v, `${v} events placed by ${p}; shown ${shown.precision[p]}`);
    for (const [c, v] of Object.entries(fixtureWritten.country)) assert(shown.country[c] === v, `${v} events of country ${c}; shown ${shown.country[c]}`);
    return JSON.stringify(shown);
  });

  await step('after a dropped connection the counts stay exact', async () => {
    const before = await snapshot();
    await page.evaluate(() => window.tailrace.drop());
    await waitFor('the map stream reconnected and its counts read again', 10000, ([c, s]) => {
      const m = window.tailrace.snapshot().map;
      return m.connections > c && m.snapshots > s;
    }, [before.map.connections, before.map.snapshots]);
    const more = [];
    for (let i = 0; i < 3; i++) more.push([fixture('language', { lang: 'pt-BR' }), 'language', 'BR']);
    for (let i = 0; i < 2; i++) more.push([fixture('none', {}), 'none', 'none']);
    appendFixtures(more);
    const shown = await countsMatchMetrics(fixtureWritten.n);
    return `${fixtureWritten.n} events, ${JSON.stringify(shown.precision)}`;
  });

  const jp = fixtureWritten.country.JP;
  await step('a click on Japan filters the list and the dots; a second click undoes it', async () => {
    // Where the map is now: the charts above it may have grown a legend line meanwhile.
    const clickAt = async (lon, lat) => {
      const box = await page.locator('#map-dots').boundingBox();
      const at = projected(lon, lat, box.width, box.height);
      await page.mouse.click(box.x + at[0], box.y + at[1]);
    };
    const all = (await snapshot()).map.drawn;
    await clickAt(138.2, 36.3); // Honshu
    const want = JSON.stringify({ '_tailrace.geo.country': 'JP' });
    const n = await waitFor(
      'only JP events listed',
      10000,
      ([want, jp]) => {
        const s = window.tailrace.snapshot();
        const lis = [...document.querySelectorAll('#events > li')];
        return s.events.filter === want && s.map.selected === 'JP' && lis.length === jp && lis.every((li) => li.dataset.country === 'JP') && lis.length;
      },
      [want, jp],
    );
    const box2 = await page.inputValue('#filter');
    assert(box2 === want, `the filter box says ${want}; saw ${box2}`);
    await waitFor(`only JP's ${jp} dots drawn`, 5000, (jp) => window.tailrace.snapshot().map.drawn === jp, jp);
    const sea = await readMap('map-dots', KNOWN_POINTS[0][0], KNOWN_POINTS[0][1], 12);
    assert(sea.mass === 0, `the open sea's dot hidden while JP is selected; saw alpha ${sea.mass}`);
    await clickAt(138.2, 36.3);
    await waitFor('every event again', 10000, () => {
      const s = window.tailrace.snapshot();
      return s.events.filter === '' && s.map.selected === null && document.querySelectorAll('#events > li').length > 0;
    });
    await waitFor('every dot again', 5000, (all) => window.tailrace.snapshot().map.drawn >= all, all);
    return `${n} JP events listed, ${jp} dots of ${all}; cleared`;
  });

  await step('a replay of the last minute at 10× draws every stored placed event', async () => {
    await page.selectOption('#map-replay-minutes', '1');
    await page.selectOption('#map-replay-speed', '10');
    await page.click('#map-replay');
    const r = await waitFor('the replay playing', 10000, () => {
      const r = window.tailrace.snapshot().map.replay;
      return r && r.state !== 'loading' && r;
    });
    // Live dots are not drawn meanwhile: a dot at a known point is the replay's.
    await waitFor(`the replay's dot at (${KNOWN_POINTS[0]})`, 8000, () => window.tailrace.snapshot().map.drawn > 0);
    let off = null;
    for (let i = 0; i < 60 && off === null; i++) {
      const d = await readMap('map-dots', KNOWN_POINTS[0][0], KNOWN_POINTS[0][1], 12);
      if (d.mass > 0) off = await dotAt(...KNOWN_POINTS[0]);
      else await page.waitForTimeout(100);
    }
    assert(off !== null, `the replay drew the known point (${KNOWN_POINTS[0]})`);
    const done = await waitFor('the replay done', 15000, () => {
      const r = window.tailrace.snapshot().map.replay;
      return r && r.state === 'done' && r;
    });
    // What the server stores in that window, read here page by page.
    let stored = 0;
    let next = `/api/events?${new URLSearchParams({ filter: JSON.stringify({ '_tailrace.geo': { $exists: true } }), from: r.from, to: r.to, order: 'oldest', limit: '1000' })}`;
    while (next) {
      const res = await fetch(`${base}${next}`);
      assert(res.ok, `GET ${next}: ${res.status}`);
      stored += (await res.json()).length;
      const m = /<([^>]+)>\s*;\s*rel="next"/.exec(res.headers.get('link') || '');
      next = m ? m[1] : null;
    }
    const placed = fixtureWritten.n - fixtureWritten.precision.none;
    assert(stored === placed, `the window holds the ${placed} placed events written; saw ${stored}`);
    assert(done.drawn === stored, `the replay drew the ${stored} stored placed events of ${r.from}..${r.to}; drew ${done.drawn}`);
    return `${done.drawn} drawn from ${done.pages} page(s), known point off by ${off.toFixed(2)} px`;
  });

  await step('no request left the origin; screenshots', async () => {
    assert(external.length === 0, `no request outside ${origin}; saw ${external.join(', ')}`);
    await page.screenshot({ path: shotPath, fullPage: true });
    const mapShot = shotPath.replace(/(\.png)?$/i, '-map.png');
    await page.locator('.map-panel').screenshot({ path: mapShot });
    return `${shotPath}, ${mapShot}`;
  });
}

const quantile = (xs, q) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor(q * s.length))] : NaN;
};

async function runMeasure() {
  await cdp.send('Performance.enable');
  await step('the map loads', async () => {
    const res = await page.goto(`${base}/`, { waitUntil: 'load' });
    assert(res && res.ok(), `GET / answered ${res && res.status()}`);
    await waitFor('the map ready with counts', 10000, () => {
      const m = window.tailrace.snapshot().map;
      return document.getElementById('map-wrap').dataset.ready === 'true' && m.snapshots > 0;
    });
  });
  await step(`frame time and heap over ${measureSeconds} s`, async () => {
    await page.waitForTimeout(10000); // the dots ring fills, the JIT warms
    const heap0 = await heapMB();
    const r0 = (await snapshot()).map.received;
    const { metrics: m0 } = await cdp.send('Performance.getMetrics');
    // Frame times as the browser paces them: the gaps between animation frames.
    await page.evaluate(() => {
      window.__frames = [];
      let last = 0;
      const tick = (t) => {
        if (last) window.__frames.push(t - last);
        last = t;
        if (window.__frames.length < 100000) requestAnimationFrame(tick);
      };
      requestAnimationFrame(tick);
    });
    await page.waitForTimeout(measureSeconds * 1000);
    const frames = await page.evaluate(() => window.__frames.splice(0));
    const s = await snapshot();
    const { metrics: m1 } = await cdp.send('Performance.getMetrics');
    const task = (m) => m.find((x) => x.name === 'TaskDuration').value;
    const heap1 = await heapMB();
    const rate = (s.map.received - r0) / measureSeconds;
    const work = s.map.frameWork;
    const out = {
      seconds: measureSeconds,
      eventsPerSecond: +rate.toFixed(0),
      frames: frames.length,
      frameMs: { p50: +quantile(frames, 0.5).toFixed(1), p95: +quantile(frames, 0.95).toFixed(1), p99: +quantile(frames, 0.99).toFixed(1), max: +Math.max(...frames).toFixed(1) },
      mapFrameWorkMs: { p50: +quantile(work, 0.5).toFixed(2), p95: +quantile(work, 0.95).toFixed(2), max: +Math.max(...work).toFixed(2) },
      mainThreadBusyPct: +((100 * (task(m1) - task(m0))) / measureSeconds).toFixed(1),
      heapMB: { start: +heap0.toFixed(2), end: +heap1.toFixed(2), growth: +(heap1 - heap0).toFixed(2) },
      dotsKept: s.map.dots,
    };
    console.log(`  ${JSON.stringify(out)}`);
    await page.locator('.map-panel').screenshot({ path: shotPath });
    assert(rate >= 900, `the map receives about 1,000 events/s; saw ${rate.toFixed(0)}`);
    assert(out.frameMs.p95 <= 16.7 + 0.5, `frame time p95 at most one 60 Hz frame (16.7 ms); saw ${out.frameMs.p95} ms`);
    assert(out.mapFrameWorkMs.p95 <= 16, `the map's work per frame p95 ≤ 16 ms; saw ${out.mapFrameWorkMs.p95} ms`);
    assert(out.heapMB.growth <= 5, `JS heap growth ≤ 5 MB; saw ${out.heapMB.growth} MB`);
    assert(external.length === 0, `no request outside ${origin}; saw ${external.join(', ')}`);
    return `screenshot ${shotPath}`;
  });
}

async function heapMB() {
  await cdp.send('HeapProfiler.collectGarbage');
  const { metrics } = await cdp.send('Performance.getMetrics');
  return metrics.find((x) => x.name === 'JSHeapUsedSize').value / 1048576;
}

let code = 0;
try {
  if (fixturePath) await runMap();
  else if (measureSeconds > 0) await runMeasure();
  else await run();
  console.log(`passed: ${stepNo} checks in ${((Date.now() - started) / 1000).toFixed(1)} s against ${base}`);
} catch (e) {
  code = 1;
  console.error(`FAIL (check ${stepNo}): ${e instanceof CheckFailed ? e.message : e && e.stack ? e.stack : e}`);
  if (problems.length) console.error(`console/network problems:\n  ${problems.join('\n  ')}`);
  await page.screenshot({ path: shotPath, fullPage: true }).then(
    () => console.error(`screenshot of the failure: ${shotPath}`),
    () => {},
  );
} finally {
  await context.close().catch(() => {});
  rmSync(userDataDir, { recursive: true, force: true });
}
process.exit(code);
