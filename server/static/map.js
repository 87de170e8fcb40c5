// The live map: where events come from, as they arrive, in the spirit of Tweet Ping.
//
// The land is world-atlas' 110 m country outlines (vendored, read with topojson-client), drawn
// once per size on one canvas in an equirectangular projection: x = (lon + 180) / 360 · width,
// y = (90 − lat) / 180 · height, height = width / 2, so a test can place a point without this
// code. Dots go on a second canvas, redrawn in animation frames while any is visible: one per
// placed event (`_tailrace.geo`), coloured and sized by precision, fading over a minute. At
// most MAX_DOTS are kept (the newest), so memory stays flat at any rate.
//
// Counts are exact: the map follows `/api/changes?collection=events` on a stream of its own,
// and once that stream is open (its start fixed) it reads `/api/geo`: the ingester's counts
// with the newest sequence number of each source they include. It then adds only the
// streamed events past those numbers; an event stamped after the read is written after it,
// so the stream has it. After every reconnect or gap it reads `/api/geo` again, so a restarted
// server's counts (new from zero, like its /metrics) replace the old ones.
//
// A click on a country filters the event list (through the page's filter box) and the dots.
// A replay draws the last N minutes of stored events, from `GET /api/events` page by page,
// at k× their received times; live dots are not drawn meanwhile (the counts keep running).

import { SseStream } from './sse.js';

/** How long a dot takes to fade, in the stream's time. */
const FADE_MS = 60000;
/** Dots kept: at 1,000 events/s the newest five seconds, at 70/s the whole minute. */
const MAX_DOTS = 5000;
/** Opacity steps: dots of one step and precision are filled as one path. */
const ALPHA_STEPS = 16;
const PRECISIONS = ['point', 'place', 'country', 'language'];
/** Colours (CSS custom properties) and radii (CSS px) by precision: finer is smaller. */
const COLORS = ['--s2', '--s4', '--s3', '--s1'];
const RADII = [2.5, 3, 3.5, 4];
/** Countries listed beside the map. */
const TOP_COUNTRIES = 10;
/** Events parsed ahead of a replay's clock; the next page is fetched below this. */
const REPLAY_AHEAD = 2000;
/** Streamed events held while `/api/geo` is read; past this the read starts over. */
const MAX_HELD = 100000;
const STREAM_IDLE_MS = 60000;
const COUNTS_EVERY_MS = 250;

const $ = (id) => document.getElementById(id);
const intFmt = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function setText(node, text) {
  if (node && node.textContent !== text) node.textContent = text;
}

const map = {
  /** @type {{code: string|null, name: string, rings: number[][][]}[]} */
  countries: [],
  /** Path2D per country in canvas pixels, for drawing and for clicks; rebuilt on resize. */
  paths: [],
  /** alpha-2 → country name, for the list beside the map. */
  names: new Map(),
  width: 0,
  height: 0,
  ready: false,
  /** The country whose events alone are shown (alpha-2), or null. */
  selected: null,
  // The dots: a ring of the newest MAX_DOTS.
  lon: new Float64Array(MAX_DOTS),
  lat: new Float64Array(MAX_DOTS),
  born: new Float64Array(MAX_DOTS),
  prec: new Uint8Array(MAX_DOTS),
  country: new Array(MAX_DOTS).fill(null),
  head: 0,
  size: 0,
  fadeMs: FADE_MS,
  drawn: 0,
  framePending: false,
  landDirty: true,
  /** Durations of the last dot frames (ms), for the measurement mode. */
  frameWork: [],
  // Counts.
  stream: null,
  /** precision → count, 'none' included; null until /api/geo answered. */
  byPrecision: null,
  byCountry: new Map(),
  /** source → the newest sequence number /api/geo counted. */
  base: new Map(),
  /** Streamed events waiting for /api/geo's answer, or null when none is awaited. */
  held: null,
  snapshotSeq: 0,
  snapshots: 0,
  received: 0,
  countsDirty: true,
  countsAt: -Infinity,
  /** The dots' colours by precision, read with the land's. */
  colors: [],
  /** The server's clock: the received time (ms) of the newest streamed event. */
  serverNowMs: 0,
  serverAt: 0,
  replay: null,
  /** Called with a filter text to apply to the event list. */
  applyFilter: null,
};

// ---------------------------------------------------------------------------------------------
// Projection and land

/** Canvas pixel of a longitude and latitude (the contract of the module doc). */
function project(lon, lat) {
  return [((lon + 180) / 360) * map.width, ((90 - lat) / 180) * map.height];
}

/**
 * A ring's longitudes made continuous (no step over 180°): world-atlas cuts Fiji and Russia at
 * the antimeridian, and Antarctica's ring circles the pole. `pole` is set for a ring that wraps
 * around the globe; it is closed along that pole.
 */
function unwrap(ring) {
  const out = [];
  let shift = 0;
  let prev = null;
  for (const [lon, lat] of ring) {
    if (prev !== null) {
      const d = lon + shift - prev;
      if (d > 180) shift -= 360;
      else if (d < -180) shift += 360;
    }
    prev = lon + shift;
    out.push([prev, lat]);
  }
  const wraps = Math.abs(out[out.length - 1][0] - out[0][0]) > 180;
  if (wraps) {
    const pole = out.reduce((s, p) => s + p[1], 0) < 0 ? -90 : 90;
    out.push([out[out.length - 1][0], pole], [out[0][0], pole]);
  }
  return out;
}

function loadWorld(world, iso) {
  const features = topojson.feature(world, world.objects.countries).features;
  for (const f of features) {
    const code = f.id !== undefined && typeof iso[f.id] === 'string' ? iso[f.id] : null;
    const name = f.properties && typeof f.properties.name === 'string' ? f.properties.name : '';
    const polygons = f.geometry.type === 'Polygon' ? [f.geometry.coordinates] : f.geometry.coordinates;
    const rings = [];
    for (const polygon of polygons) for (const ring of polygon) rings.push(unwrap(ring));
    map.countries.push({ code, name, rings });
    if (code) map.names.set(code, name);
  }
}

function buildPaths() {
  map.paths = map.countries.map((c) => {
    const path = new Path2D();
    for (const ring of c.rings) {
      let lo = Infinity;
      let hi = -Infinity;
      for (const p of ring) {
        lo = Math.min(lo, p[0]);
        hi = Math.max(hi, p[0]);
      }
      // The ring once where it is, and once a world over where it runs past an edge.
      for (const offset of [0, 360, -360]) {
        if (offset !== 0 && !(lo + offset < 180 && hi + offset > -180)) continue;
        ring.forEach(([lon, lat], i) => {
          const [x, y] = project(lon + offset, lat);
          if (i === 0) path.moveTo(x, y);
          else path.lineTo(x, y);
        });
        path.closePath();
      }
    }
    return path;
  });
}

function drawLand() {
  const canvas = $('map-land');
  const ctx = canvas.getContext('2d');
  ctx.fillStyle = css('--ocean');
  ctx.fillRect(0, 0, map.width, map.height);
  const land = css('--land');
  const border = css('--panel');
  const selected = css('--accent');
  ctx.lineWidth = Math.max(0.5, (devicePixelRatio || 1) * 0.6);
  ctx.strokeStyle = border;
  map.paths.forEach((path, i) => {
    ctx.fillStyle = map.selected && map.countries[i].code === map.selected ? selected : land;
    ctx.fill(path, 'evenodd');
    ctx.stroke(path);
  });
  // Read here, not per frame: a computed style may cost a style recalculation.
  map.colors = COLORS.map(css);
  map.landDirty = false;
}

/** Sizes both canvases to the wrapper (in device pixels, width even), then redraws. */
function resize() {
  const wrap = $('map-wrap');
  const dpr = devicePixelRatio || 1;
  const width = Math.max(2, Math.round((wrap.clientWidth * dpr) / 2) * 2);
  if (width === map.width) return;
  map.width = width;
  map.height = width / 2;
  for (const id of ['map-land', 'map-dots']) {
    const c = $(id);
    c.width = map.width;
    c.height = map.height;
  }
  wrap.dataset.width = String(map.width);
  buildPaths();
  map.landDirty = true;
  schedule();
}

// ---------------------------------------------------------------------------------------------
// Dots

function addDot(lon, lat, precision, country, born) {
  const i = map.head;
  map.lon[i] = lon;
  map.lat[i] = lat;
  map.prec[i] = precision;
  map.country[i] = country;
  map.born[i] = born;
  map.head = (i + 1) % MAX_DOTS;
  if (map.size < MAX_DOTS) map.size++;
  schedule();
}

function clearDots() {
  map.size = 0;
  map.head = 0;
  map.country.fill(null);
  schedule();
}

function schedule() {
  if (map.framePending) return;
  map.framePending = true;
  requestAnimationFrame(frame);
}

/** One animation frame: the land if it changed, every visible dot, the replay's clock. */
function frame(now) {
  map.framePending = false;
  if (!map.ready) return;
  const started = performance.now();
  if (map.landDirty) drawLand();
  if (map.replay) stepReplay(performance.now());
  const canvas = $('map-dots');
  const ctx = canvas.getContext('2d');
  ctx.clearRect(0, 0, map.width, map.height);
  const dpr = devicePixelRatio || 1;
  const t = performance.now();
  // Bucketed by precision and opacity step: one path and one fill per bucket.
  const buckets = new Array(PRECISIONS.length * ALPHA_STEPS);
  const seen = new Set();
  let alive = 0;
  let drawn = 0;
  for (let k = 0; k < map.size; k++) {
    const i = (map.head - 1 - k + MAX_DOTS) % MAX_DOTS;
    const age = t - map.born[i];
    if (age >= map.fadeMs) break; // older ones are older still: the ring is in arrival order
    alive++;
    if (age < 0) continue; // a replayed dot whose time has not come
    if (map.selected && map.country[i] !== map.selected) continue;
    const step = Math.min(ALPHA_STEPS - 1, Math.floor((age / map.fadeMs) * ALPHA_STEPS));
    const b = map.prec[i] * ALPHA_STEPS + step;
    drawn++;
    // project(), inlined: no array per dot per frame.
    const x = ((map.lon[i] + 180) / 360) * map.width;
    const y = ((90 - map.lat[i]) / 180) * map.height;
    // Events placed by country or language share their country's point: a dot already in
    // this bucket at the same place would paint the same pixels again.
    // (Within a sixteenth of a pixel counts as the same place: a number, not a string, per dot.)
    const at = (b * 131072 + Math.round(x * 16)) * 131072 + Math.round(y * 16);
    if (seen.has(at)) continue;
    seen.add(at);
    let path = buckets[b];
    if (!path) path = buckets[b] = new Path2D();
    const r = RADII[map.prec[i]] * dpr;
    path.moveTo(x + r, y);
    path.arc(x, y, r, 0, 2 * Math.PI);
  }
  // Dots past their fade are forgotten, so the loop above stays short.
  map.size = Math.min(map.size, alive);
  const colors = map.colors;
  for (let b = 0; b < buckets.length; b++) {
    if (!buckets[b]) continue;
    const p = Math.floor(b / ALPHA_STEPS);
    ctx.globalAlpha = 0.9 * (1 - (b % ALPHA_STEPS) / ALPHA_STEPS);
    ctx.fillStyle = colors[p];
    ctx.fill(buckets[b]);
  }
  ctx.globalAlpha = 1;
  map.drawn = drawn;
  // Counts change with every event; read at most four times a second.
  if (map.countsDirty && t - map.countsAt > COUNTS_EVERY_MS) renderCounts();
  const work = performance.now() - started;
  map.frameWork.push(work);
  if (map.frameWork.length > 4000) map.frameWork.splice(0, 2000);
  if (map.size > 0 || map.replay || map.countsDirty) schedule();
}

// ---------------------------------------------------------------------------------------------
// Counts: /api/geo, then the stream

function precisionIndex(p) {
  return PRECISIONS.indexOf(p);
}

function count(source, seq, precision, country) {
  if (map.held) {
    map.held.push([source, seq, precision, country]);
    if (map.held.length > MAX_HELD) readCounts();
    return;
  }
  if (!map.byPrecision) return;
  const base = map.base.get(source);
  if (base !== undefined && !(seq > base)) return; // counted by /api/geo already
  map.byPrecision[precision] = (map.byPrecision[precision] || 0) + 1;
  map.byCountry.set(country, (map.byCountry.get(country) || 0) + 1);
  map.countsDirty = true;
  schedule();
}

/** Reads /api/geo, holding the streamed events meanwhile; then applies those past it. */
async function readCounts() {
  const mine = ++map.snapshotSeq;
  map.held = [];
  let body = null;
  for (let attempt = 0; body === null; attempt++) {
    try {
      const res = await fetch('/api/geo', { cache: 'no-store' });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      body = await res.json();
    } catch {
      if (mine !== map.snapshotSeq) return;
      await new Promise((r) => setTimeout(r, Math.min(10000, 500 * 2 ** attempt)));
    }
    if (mine !== map.snapshotSeq) return; // a newer read started
  }
  const held = map.held;
  map.held = null;
  map.byPrecision = { ...(body.precision || {}) };
  map.byCountry = new Map(Object.entries(body.country || {}));
  map.base = new Map(Object.entries(body.seq || {}));
  for (const [source, seq, precision, country] of held) count(source, seq, precision, country);
  map.snapshots++;
  map.countsDirty = true;
  schedule();
}

function onEvent(ev) {
  if (ev.type === 'gap') {
    readCounts(); // events were lost to this stream: start from the server's counts again
    return;
  }
  if (ev.type === 'state') {
    // A fresh stream's initial documents are sent: its tail starts here.
    if (ev.data.includes('"ready"')) readCounts();
    return;
  }
  if (ev.type !== 'initial' && ev.type !== 'change') return;
  let msg;
  try {
    msg = JSON.parse(ev.data);
  } catch {
    return; // the list's stream reports a message that is not JSON
  }
  const stamp = msg && msg.doc && msg.doc._tailrace;
  if (!stamp || typeof stamp.source !== 'string' || !Number.isSafeInteger(stamp.seq)) return;
  map.received++;
  const geo = stamp.geo && typeof stamp.geo === 'object' ? stamp.geo : null;
  const p = geo ? precisionIndex(geo.precision) : -1;
  const country = geo && typeof geo.country === 'string' ? geo.country : 'none';
  count(stamp.source, stamp.seq, p >= 0 ? PRECISIONS[p] : 'none', country);
  if (ev.type !== 'change') return; // the initial document is old news: no dot
  if (Number.isFinite(stamp.received_us)) {
    map.serverNowMs = stamp.received_us / 1000;
    map.serverAt = performance.now();
  }
  if (p < 0 || map.replay || !Number.isFinite(geo.lon) || !Number.isFinite(geo.lat)) return;
  addDot(geo.lon, geo.lat, p, country === 'none' ? null : country, performance.now());
}

function openStream() {
  map.stream = new SseStream({
    // One initial document: its `ready` marks where the tail starts (readCounts).
    url: '/api/changes?collection=events&include_initial=true&initial_limit=1',
    idleMs: STREAM_IDLE_MS,
    onEvent,
    onState: (state) => {
      // Resuming after an id: the tail's start is fixed by that id, read the counts now.
      if (state === 'open' && map.stream && map.stream.lastEventId) readCounts();
    },
  });
  map.stream.start();
}

function row(cells) {
  const tr = document.createElement('tr');
  for (const [text, cls] of cells) {
    const td = document.createElement('td');
    if (cls) td.className = cls;
    td.textContent = text;
    tr.append(td);
  }
  return tr;
}

function renderCounts() {
  map.countsDirty = false;
  map.countsAt = performance.now();
  const c = map.byPrecision;
  const fmt = (v) => (c ? intFmt.format(v || 0) : '–');
  for (const p of [...PRECISIONS, 'none']) setText($(`map-count-${p}`), fmt(c && c[p]));
  const total = c ? Object.values(c).reduce((a, b) => a + b, 0) : 0;
  setText($('map-total'), c ? intFmt.format(total) : '–');
  const top = [...map.byCountry].filter(([code]) => code !== 'none').sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
  const body = $('map-countries').tBodies[0];
  const rows = top.slice(0, TOP_COUNTRIES).map(([code, n]) => {
    const tr = row([[code, 'code'], [map.names.get(code) || '', 'value'], [intFmt.format(n), 'num']]);
    tr.dataset.country = code;
    if (code === map.selected) tr.className = 'selected';
    return tr;
  });
  const none = map.byCountry.get('none') || 0;
  const tr = row([['–', 'code'], ['no country', 'value'], [intFmt.format(none), 'num']]);
  tr.dataset.country = 'none';
  rows.push(tr);
  body.replaceChildren(...rows);
}

// ---------------------------------------------------------------------------------------------
// A country filters the list and the dots

/** The filter text that shows one country's events. */
export function countryFilter(code) {
  return JSON.stringify({ '_tailrace.geo.country': code });
}

/** The page applied `filter` to the list: select its country if it is a country's filter. */
export function onFilterApplied(filter) {
  let code = null;
  try {
    const f = filter ? JSON.parse(filter) : null;
    const keys = f && typeof f === 'object' ? Object.keys(f) : [];
    if (keys.length === 1 && keys[0] === '_tailrace.geo.country' && typeof f[keys[0]] === 'string') code = f[keys[0]];
  } catch {
    // not a country's filter
  }
  if (code === map.selected) return;
  map.selected = code;
  $('map-clear').hidden = code === null;
  setText($('map-selected'), code ? `${map.names.get(code) || code} (${code})` : '');
  map.landDirty = true;
  map.countsDirty = true;
  schedule();
}

function select(code) {
  if (!map.applyFilter) return;
  map.applyFilter(code && code !== map.selected ? countryFilter(code) : '');
}

/** The country under a canvas pixel, or null. */
function countryAt(x, y) {
  const ctx = $('map-land').getContext('2d');
  for (let i = 0; i < map.paths.length; i++) {
    if (map.countries[i].code && ctx.isPointInPath(map.paths[i], x, y, 'evenodd')) return map.countries[i];
  }
  return null;
}

function canvasPoint(e) {
  const rect = $('map-dots').getBoundingClientRect();
  return [((e.clientX - rect.left) / rect.width) * map.width, ((e.clientY - rect.top) / rect.height) * map.height];
}

function onClick(e) {
  if (!map.ready) return;
  const c = countryAt(...canvasPoint(e));
  if (c) select(c.code);
}

let hoverPending = false;
let hoverEvent = null;
function onMove(e) {
  hoverEvent = e;
  if (hoverPending) return;
  hoverPending = true;
  requestAnimationFrame(() => {
    hoverPending = false;
    if (!map.ready || !hoverEvent) return;
    const c = countryAt(...canvasPoint(hoverEvent));
    const n = c ? map.byCountry.get(c.code) || 0 : 0;
    setText($('map-hover'), c ? `${c.name} (${c.code}): ${intFmt.format(n)} events` : '');
    $('map-dots').style.cursor = c ? 'pointer' : '';
  });
}

// ---------------------------------------------------------------------------------------------
// Replay: the last N minutes at k×

function serverNow() {
  return map.serverNowMs ? map.serverNowMs + (performance.now() - map.serverAt) : Date.now();
}

function replayUrl(from, to) {
  const filter = { '_tailrace.geo': { $exists: true } };
  if (map.selected) filter['_tailrace.geo.country'] = map.selected;
  const q = new URLSearchParams({
    filter: JSON.stringify(filter),
    from: new Date(from).toISOString(),
    to: new Date(to).toISOString(),
    order: 'oldest',
    limit: '1000',
  });
  return `/api/events?${q}`;
}

function nextLink(res) {
  const link = res.headers.get('link') || '';
  const m = /<([^>]+)>\s*;\s*rel="next"/.exec(link);
  return m ? m[1] : null;
}

function startReplay(minutes, speed) {
  stopReplay();
  const to = serverNow();
  const from = to - minutes * 60000;
  map.replay = {
    from,
    to,
    speed,
    started: performance.now(),
    next: replayUrl(from, to),
    queue: [],
    fetching: false,
    controller: new AbortController(),
    fetched: 0,
    drawn: 0,
    pages: 0,
    clock: from,
    state: 'loading',
    error: '',
  };
  clearDots();
  map.fadeMs = FADE_MS / speed;
  $('map-replay').textContent = 'Stop';
  pump();
  schedule();
}

function stopReplay(message = '') {
  const r = map.replay;
  if (!r) return;
  r.controller.abort();
  map.lastReplay = { ...replaySummary(r), state: message ? 'failed' : r.state === 'done' ? 'done' : 'stopped', error: message };
  map.replay = null;
  map.fadeMs = FADE_MS;
  clearDots();
  $('map-replay').textContent = 'Replay';
  setText($('map-replay-state'), message || (map.lastReplay.state === 'done' ? `replayed ${intFmt.format(r.drawn)} events` : ''));
}

/** Fetches pages while fewer than REPLAY_AHEAD events wait. */
async function pump() {
  const r = map.replay;
  if (!r || r.fetching || !r.next || r.queue.length >= REPLAY_AHEAD) return;
  r.fetching = true;
  try {
    const res = await fetch(r.next, { signal: r.controller.signal, cache: 'no-store' });
    if (!res.ok) {
      let message = `HTTP ${res.status}`;
      try {
        message = (await res.json()).error || message;
      } catch {
        // the status says enough
      }
      throw new Error(message);
    }
    const page = await res.json();
    if (map.replay !== r) return;
    r.next = nextLink(res);
    r.pages++;
    for (const item of page) {
      const s = item && item.doc && item.doc._tailrace;
      const geo = s && s.geo;
      const p = geo ? precisionIndex(geo.precision) : -1;
      if (p < 0 || !Number.isFinite(s.received_us)) continue;
      r.queue.push({ t: s.received_us / 1000, lon: geo.lon, lat: geo.lat, p, c: typeof geo.country === 'string' ? geo.country : null });
      r.fetched++;
    }
    if (r.state === 'loading') {
      // The clock starts with the first page, so a slow first answer does not skip events.
      r.state = 'playing';
      r.started = performance.now();
    }
  } catch (e) {
    if (map.replay === r && !r.controller.signal.aborted) stopReplay(`replay failed: ${e instanceof Error ? e.message : e}`);
    return;
  } finally {
    r.fetching = false;
  }
  schedule();
  pump();
}

function stepReplay(now) {
  const r = map.replay;
  if (r.state === 'loading') return;
  r.clock = Math.min(r.to, r.from + (now - r.started) * r.speed);
  let n = 0;
  while (n < r.queue.length && r.queue[n].t <= r.clock) {
    const e = r.queue[n++];
    // Born when the replay's clock passed its received time, in this page's time.
    addDot(e.lon, e.lat, e.p, e.c, r.started + (e.t - r.from) / r.speed);
  }
  if (n) {
    r.queue.splice(0, n);
    r.drawn += n;
    pump();
  }
  const at = new Date(r.clock).toLocaleTimeString([], { hour12: false });
  setText($('map-replay-state'), `replaying ${at} at ${r.speed}× · ${intFmt.format(r.drawn)} drawn`);
  if (r.clock >= r.to && !r.next && !r.fetching && r.queue.length === 0) {
    r.state = 'done';
    // The last dots fade, then the live ones come back.
    if (now - r.started > (r.to - r.from) / r.speed + map.fadeMs) stopReplay();
  }
}

function replaySummary(r) {
  return {
    state: r.state,
    from: new Date(r.from).toISOString(),
    to: new Date(r.to).toISOString(),
    speed: r.speed,
    clock: new Date(r.clock).toISOString(),
    fetched: r.fetched,
    drawn: r.drawn,
    pages: r.pages,
  };
}

// ---------------------------------------------------------------------------------------------
// Start

/** What the map shows, for tests and the console. */
export function mapSnapshot() {
  return {
    ready: map.ready,
    width: map.width,
    height: map.height,
    dots: map.size,
    drawn: map.drawn,
    selected: map.selected,
    counts: map.byPrecision ? { ...map.byPrecision } : null,
    countries: Object.fromEntries(map.byCountry),
    snapshots: map.snapshots,
    received: map.received,
    connections: map.stream ? map.stream.connections : 0,
    lastEventId: map.stream ? map.stream.lastEventId : '',
    replay: map.replay ? replaySummary(map.replay) : map.lastReplay || null,
    frameWork: map.frameWork.slice(-2000),
  };
}

/** Drops the map's stream as a network failure would. */
export function dropMap(reason) {
  if (map.stream) map.stream.drop(reason);
}

/**
 * Starts the map. `applyFilter(text)` applies a filter to the page's event list (the page
 * calls `onFilterApplied` once the server accepted it).
 */
export async function startMap(applyFilter) {
  map.applyFilter = applyFilter;
  const legend = $('map-legend');
  PRECISIONS.forEach((p, i) => {
    const sw = legend.querySelector(`[data-precision="${p}"] .swatch`);
    if (sw) {
      sw.style.setProperty('--swatch', `var(${COLORS[i]})`);
      sw.style.setProperty('--size', `${RADII[i] * 2}px`);
    }
  });
  openStream();
  $('map-clear').addEventListener('click', () => select(null));
  $('map-countries').addEventListener('click', (e) => {
    const tr = e.target instanceof Element ? e.target.closest('tr') : null;
    if (tr && tr.dataset.country && tr.dataset.country !== 'none') select(tr.dataset.country);
  });
  $('map-replay').addEventListener('click', () => {
    if (map.replay) stopReplay();
    else startReplay(Number($('map-replay-minutes').value), Number($('map-replay-speed').value));
  });
  const dots = $('map-dots');
  dots.addEventListener('click', onClick);
  dots.addEventListener('mousemove', onMove);
  dots.addEventListener('mouseleave', () => {
    hoverEvent = null;
    setText($('map-hover'), '');
  });
  matchMedia('(prefers-color-scheme: dark)').addEventListener('change', () => {
    map.landDirty = true;
    schedule();
  });
  try {
    const [world, iso] = await Promise.all(
      ['/assets/vendor/countries-110m.json', '/assets/iso3166.json'].map(async (url) => {
        const res = await fetch(url);
        if (!res.ok) throw new Error(`${url}: HTTP ${res.status}`);
        return res.json();
      }),
    );
    if (typeof topojson !== 'object') throw new Error('topojson-client is missing');
    loadWorld(world, iso);
  } catch (e) {
    setText($('map-hover'), `The map could not be drawn: ${e instanceof Error ? e.message : e}`);
    return;
  }
  map.ready = true;
  new ResizeObserver(resize).observe($('map-wrap'));
  resize();
  $('map-wrap').dataset.ready = 'true';
  schedule();
}
