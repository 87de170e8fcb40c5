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

import { createRequire } from 'node:module';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const started = Date.now();
const args = process.argv.slice(2);
const soakAt = args.indexOf('--soak');
const soakSeconds = soakAt >= 0 ? Number(args.splice(soakAt, 2)[1]) : 0;
if (args.length !== 2 || !/^https?:\/\//.test(args[0]) || !Number.isFinite(soakSeconds)) {
  console.error('usage: node check_page.mjs BASE_URL SCREENSHOT.png [--soak SECONDS]');
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
      return { stats: s.stats.lastEventId, events: s.events.lastEventId };
    });
    assert(ids.stats && ids.events, `both streams had an id to resume from; saw ${JSON.stringify(ids)}`);
    await waitFor(
      'both streams reconnected and live',
      10000,
      ([s0, e0]) => {
        const s = window.tailrace.snapshot();
        return s.stats.connections > s0 && s.events.connections > e0 && document.getElementById('conn').dataset.state === 'live';
      },
      [before.stats.connections, before.events.connections],
    );
    const resumed = changeRequests.slice(reqsBefore);
    const statsReq = resumed.find((r) => r.url.includes('collection=stats'));
    const eventsReq = resumed.find((r) => r.url.includes('collection=events'));
    assert(statsReq && statsReq.lastEventId === ids.stats, `stats resumed with Last-Event-ID ${ids.stats}; saw ${JSON.stringify(statsReq)}`);
    assert(eventsReq && eventsReq.lastEventId === ids.events, `events resumed with Last-Event-ID ${ids.events}; saw ${JSON.stringify(eventsReq)}`);
    const r0 = (await snapshot()).events.received;
    await waitFor('events after the reconnect', 5000, (r0) => window.tailrace.snapshot().events.received > r0 + 20, r0);
    const after = await snapshot();
    assert(after.events.duplicates === 0, `no event delivered twice; saw ${after.events.duplicates} duplicates`);
    assert(after.events.seqGaps === 0, `no event missed (contiguous _tailrace.seq); saw ${after.events.seqGaps} missing`);
    assert(after.events.gaps === 0, `no gap reported; saw ${after.events.gaps}`);
    return `resumed after stats ${ids.stats}, events ${ids.events}`;
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

let code = 0;
try {
  await run();
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
