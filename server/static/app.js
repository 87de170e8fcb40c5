// The live page: the header from /api/status, three charts and two tables from the `stats`
// change stream, the newest events from the `events` change stream (optionally filtered), and
// the map of where events come from (map.js).
//
// Built to run for hours at 70 events/s (bursts of 350/s): every array and the DOM are
// bounded, rendering happens at most once per animation frame, streams reconnect without
// adding timers or listeners, and no data is ever parsed as HTML (textContent only).

import { SseStream } from './sse.js';
import { querySnapshot, startQuery } from './query.js';
import { dropMap, mapSnapshot, onFilterApplied, startMap } from './map.js';

/** Points kept per chart: 10 minutes at one point per second. */
const WINDOW_POINTS = 600;
/** Events kept in the list (and in the queue waiting for the next frame). */
const MAX_EVENTS = 100;
/** Events fetched when the events stream (re)starts. */
const INITIAL_EVENTS = 50;
/** Statistics are rewritten every second: this much silence means the numbers are stale. */
const STALE_AFTER_MS = 5000;
/**
 * A stats stream silent this long is dead: stats arrive every second, and even an idle server
 * sends a keep-alive comment every 15 s (axum's default), so 45 s is three missed keep-alives.
 */
const STATS_IDLE_MS = 45000;
/** A filtered events stream may be quiet; the server's keep-alive comments keep it alive. */
const EVENTS_IDLE_MS = 60000;
/** Recently seen event keys, to count duplicates across reconnects. */
const RECENT_KEYS = 2000;
const CHART_HEIGHT = 170;

// ---------------------------------------------------------------------------------------------
// Small helpers

/**
 * Creates an element. Children that are strings become text nodes: data never goes through
 * an HTML parser, so `<img onerror=…>` in a tweet stays text.
 */
function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null) continue;
    if (k === 'class') e.className = v;
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else e.setAttribute(k, String(v));
  }
  e.append(...children);
  return e;
}

/** Any JSON value as display text. */
function str(v) {
  if (typeof v === 'string') return v;
  if (v === undefined || v === null) return '';
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  return JSON.stringify(v);
}

const num = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
const intFmt = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });
const oneFmt = new Intl.NumberFormat('en-US', { maximumFractionDigits: 1 });

function fmtInt(v) {
  return num(v) === null ? '–' : intFmt.format(v);
}

function fmtRate(v) {
  return num(v) === null ? '–' : v < 100 ? oneFmt.format(v) : intFmt.format(v);
}

/** Microseconds, in the unit a person reads fastest. */
function fmtUs(v) {
  if (num(v) === null) return '–';
  if (v < 1000) return `${Math.round(v)} µs`;
  if (v < 1e6) return `${(v / 1000).toFixed(v < 10000 ? 2 : 1)} ms`;
  return `${(v / 1e6).toFixed(2)} s`;
}

function fmtUsAxis(v) {
  if (v < 1000) return `${+v.toPrecision(3)}µs`;
  if (v < 1e6) return `${+(v / 1000).toPrecision(3)}ms`;
  return `${+(v / 1e6).toPrecision(3)}s`;
}

const pad = (n, w = 2) => String(n).padStart(w, '0');

/** Local wall-clock time of a µs timestamp, to the millisecond. */
function fmtClock(us) {
  const d = new Date(us / 1000);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

function fmtAge(ms) {
  if (ms < 1000) return 'now';
  if (ms < 60000) return `${Math.floor(ms / 1000)} s ago`;
  if (ms < 3600000) return `${Math.floor(ms / 60000)} min ago`;
  return `${Math.floor(ms / 3600000)} h ago`;
}

function setText(node, text) {
  if (node && node.textContent !== text) node.textContent = text;
}

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

/**
 * JSON.parse that keeps integers beyond 2^53 exact (tweet ids are 19 digits) where the
 * browser can (JSON.rawJSON); used only to show a document, never on the hot path.
 */
function parseExact(text) {
  if (typeof JSON.rawJSON !== 'function') return JSON.parse(text);
  return JSON.parse(text, (key, value, ctx) =>
    typeof value === 'number' && !Number.isSafeInteger(value) && ctx && /^-?\d+$/.test(ctx.source)
      ? JSON.rawJSON(ctx.source)
      : value,
  );
}

// ---------------------------------------------------------------------------------------------
// Charts

/**
 * Time series in one-second buckets with a column per series, bounded to WINDOW_POINTS rows.
 * Values of several documents that fall into the same second share a row, so series of
 * different feeds line up on one x axis as uPlot needs.
 */
class Table {
  constructor(max) {
    this.max = max;
    this.xs = [];
    /** @type {Map<string, Array<number|null>>} series key → column */
    this.cols = new Map();
    this.dirty = false;
    /** Bumped when a column appears: the chart is rebuilt with the new series. */
    this.shape = 0;
  }

  /** Sets `values` (series key → number or null) at second `x`. */
  put(x, values) {
    const xs = this.xs;
    let i = xs.length - 1;
    while (i >= 0 && xs[i] > x) i--;
    let row;
    if (i >= 0 && xs[i] === x) {
      row = i;
    } else {
      if (i < 0 && xs.length >= this.max) return; // older than the whole window
      row = i + 1;
      xs.splice(row, 0, x);
      for (const col of this.cols.values()) col.splice(row, 0, null);
    }
    for (const [key, v] of Object.entries(values)) {
      let col = this.cols.get(key);
      if (!col) {
        col = new Array(xs.length).fill(null);
        this.cols.set(key, col);
        this.shape++;
      }
      col[row] = v;
    }
    while (xs.length > this.max) {
      xs.shift();
      for (const col of this.cols.values()) col.shift();
    }
    this.dirty = true;
  }

  clear() {
    this.xs.length = 0;
    this.cols.clear();
    this.shape++;
    this.dirty = true;
  }
}

/** One uPlot chart over a Table; `data-points`/`data-last-x` on its container for tests. */
class Chart {
  /**
   * @param {HTMLElement} node container
   * @param {object} o
   * @param {boolean} [o.log] log-scale y (latencies)
   * @param {(keys: string[]) => object[]} o.series uPlot series options for the columns
   * @param {(keys: string[]) => object[]} [o.bands]
   * @param {(v: number) => string} [o.yFormat]
   * @param {boolean} [o.zeroBased]
   * @param {() => {x: number, dir: string}[]} [o.marks] vertical marks (trend changes), drawn
   *   over the plot; how many are in view is `data-marks` on the container
   */
  constructor(node, o) {
    this.node = node;
    this.o = o;
    this.table = new Table(WINDOW_POINTS);
    this.u = null;
    this.builtShape = -1;
    this.width = 0;
  }

  put(x, values) {
    if (this.o.log) {
      // A log axis cannot show zero or negative values: they are gaps, not errors.
      for (const k of Object.keys(values)) if (!(values[k] > 0)) values[k] = null;
    }
    this.table.put(x, values);
  }

  data() {
    return [this.table.xs, ...this.table.cols.values()];
  }

  build() {
    if (this.u) this.u.destroy();
    const keys = [...this.table.cols.keys()];
    const axisStroke = css('--muted');
    const grid = { stroke: css('--grid'), width: 1 };
    const o = this.o;
    const yScale = o.log
      ? { distr: 3, log: 10 }
      : {
          // Rates are never negative: a Bollinger lower band below zero is cut at the axis.
          range: (u, min, max) => [o.zeroBased ? 0 : (min ?? 0), max !== null && max > 0 ? max * 1.08 : 1],
        };
    this.width = Math.max(200, this.node.clientWidth);
    this.u = new uPlot(
      {
        width: this.width,
        height: CHART_HEIGHT,
        pxAlign: false,
        cursor: { sync: { key: 'tailrace' }, drag: { x: false, y: false } },
        legend: { live: true },
        scales: {
          // At least a minute wide: the first seconds of data are not stretched over the
          // chart with millisecond ticks, and points enter from the right.
          x: { time: true, range: (u, min, max) => (min === null ? [0, 60] : [Math.min(min, max - 60), max]) },
          y: yScale,
        },
        axes: [
          { stroke: axisStroke, grid, ticks: grid, size: 28 },
          {
            stroke: axisStroke,
            grid,
            ticks: grid,
            size: 52,
            values: o.yFormat ? (u, splits) => splits.map((v) => (v === null ? '' : o.yFormat(v))) : undefined,
          },
        ],
        series: [
          { label: 'time', value: (u, v) => (v === null ? '–' : fmtClock(v * 1e6).slice(0, 8)) },
          ...o.series(keys),
        ],
        bands: o.bands ? o.bands(keys) : undefined,
        hooks: {
          // Without a cursor over the plot, the legend shows the newest values.
          setData: [(u) => u.cursor.left < 0 && u.data[0].length > 0 && u.setLegend({ idx: u.data[0].length - 1 })],
          draw: o.marks ? [(u) => drawMarks(u, o.marks(), this.node)] : [],
        },
      },
      this.data(),
      this.node,
    );
    this.builtShape = this.table.shape;
  }

  /** Called once per animation frame. */
  render() {
    if (!this.table.dirty && this.u) return;
    if (!this.u || this.builtShape !== this.table.shape) this.build();
    else this.u.setData(this.data());
    this.table.dirty = false;
    const xs = this.table.xs;
    this.node.dataset.points = String(xs.length);
    this.node.dataset.lastX = xs.length ? String(xs[xs.length - 1]) : '';
  }

  resize() {
    const w = Math.max(200, this.node.clientWidth);
    if (this.u && w !== this.width) {
      this.width = w;
      this.u.setSize({ width: w, height: CHART_HEIGHT });
    }
  }

  /** Rebuild with the current colours (the colour scheme changed). */
  restyle() {
    if (this.u) this.build();
  }
}

/**
 * Draws each mark in the x range as a dashed vertical line with ▲ (up) or ▼ (down) at the top;
 * sets `data-marks` on `node` to how many were drawn.
 */
function drawMarks(u, marks, node) {
  const { min, max } = u.scales.x;
  const dpr = devicePixelRatio || 1;
  const { top, height } = u.bbox;
  const ctx = u.ctx;
  let drawn = 0;
  ctx.save();
  ctx.lineWidth = dpr;
  ctx.setLineDash([3 * dpr, 3 * dpr]);
  ctx.font = `${11 * dpr}px system-ui, sans-serif`;
  ctx.textAlign = 'center';
  for (const m of marks) {
    if (min === null || m.x < min || m.x > max) continue;
    const px = u.valToPos(m.x, 'x', true);
    ctx.strokeStyle = ctx.fillStyle = css(m.dir === 'up' ? '--s2' : '--s3');
    ctx.beginPath();
    ctx.moveTo(px, top);
    ctx.lineTo(px, top + height);
    ctx.stroke();
    ctx.fillText(m.dir === 'up' ? '▲' : '▼', px, top + 11 * dpr);
    drawn++;
  }
  ctx.restore();
  node.dataset.marks = String(drawn);
}

const PALETTE = ['--s1', '--s2', '--s3', '--s4', '--s5', '--s6'];

/**
 * Series for columns named "<group> p50" / "<group> p99": one colour per group, p50 solid,
 * p99 dashed; colours follow the order groups first appeared, so they never jump.
 */
function quantileSeries(keys) {
  const groups = [];
  return keys.map((key) => {
    const group = key.replace(/ p\d+$/, '');
    let g = groups.indexOf(group);
    if (g < 0) g = groups.push(group) - 1;
    const stroke = css(PALETTE[g % PALETTE.length]);
    const p99 = key.endsWith(' p99');
    return {
      label: key,
      stroke,
      width: p99 ? 1 : 1.5,
      dash: p99 ? [4, 3] : undefined,
      spanGaps: true,
      value: (u, v) => fmtUs(v),
      points: { show: false },
    };
  });
}

// ---------------------------------------------------------------------------------------------
// State

const $ = (id) => document.getElementById(id);

const charts = {
  rate: null,
  notify: null,
  write: null,
};

const stats = {
  /** @type {object|null} the `info` of /api/status */
  info: null,
  /** @type {Map<string, object>} feed name → its stats document */
  feeds: new Map(),
  /** @type {object|null} the `ingest` document */
  ingest: null,
  /** Feed whose rate and top-k are shown; the first tailable one. */
  rateFeed: null,
  lastAt: 0,
  received: 0,
  dirty: false,
  stream: null,
  /** Non-fatal notes (gaps) for the header tooltip. */
  gaps: 0,
};

/** Breakouts of the feeds' rates from their bands (the `trends` collection). */
const trends = {
  /** @type {{feed: string, x: number, dir: string}[]} oldest first, at most MAX_TRENDS */
  marks: [],
  /** The newest breakout document of the rate chart's feed. */
  last: null,
  stream: null,
};
const MAX_TRENDS = 200;

const events = {
  /** The stream whose events are shown. */
  stream: null,
  /** A stream opened for a new filter, shown once the server accepts it (HTTP 200). */
  candidate: null,
  /** The filter text of `stream`. */
  filter: '',
  /** Messages waiting for the next frame, oldest first, at most MAX_EVENTS. */
  pending: [],
  /** Keys to remove at the next frame (delete changes). */
  removals: new Set(),
  /** key → li of every event in the list. */
  shown: new Map(),
  /** Raw message text of each li, parsed again only when a person opens it. */
  raw: new WeakMap(),
  recent: new Set(),
  recentRing: [],
  received: 0,
  duplicates: 0,
  seqGaps: 0,
  gaps: 0,
  /** source → last `_tailrace.seq` seen, only while unfiltered (a filter skips sequence numbers). */
  lastSeq: new Map(),
  paused: false,
  clear: false,
  /** Received counts per second, for the events/s next to the list. */
  perSecond: [],
  thisSecond: 0,
};

/**
 * Renders happen in an animation frame, and at most every RENDER_INTERVAL_MS: nobody reads a
 * list faster than that, and repainting this text-heavy page on every frame kept the main
 * thread 51% busy at 70 events/s; every 100 ms, 15%; every 200 ms, 10% (headless Chromium,
 * software raster; the paused list alone costs 5%). Events arriving meanwhile are batched.
 */
const RENDER_INTERVAL_MS = 200;
/**
 * Above BUSY_RATE events/s the list is redrawn once a second instead: each redraw then
 * replaces all its rows, whose text (every script, emoji) is styled and laid out anew in one
 * long frame, and five of those a second made the map's animation stutter. Nobody reads a
 * list that turns over in a tenth of a second anyway.
 */
const BUSY_RATE = 250;
const BUSY_LIST_INTERVAL_MS = 1000;
let lastListRender = 0;
let renderPending = false;
let lastRender = 0;

function scheduleRender() {
  if (renderPending) return;
  renderPending = true;
  const wait = lastRender + RENDER_INTERVAL_MS - performance.now();
  if (wait <= 0) {
    requestAnimationFrame(render);
  } else {
    setTimeout(() => requestAnimationFrame(render), wait); // one at a time: renderPending
  }
}

// ---------------------------------------------------------------------------------------------
// Header: /api/status

let statusTimer = 0;
let statusAttempt = 0;
let statusLoading = false;

async function loadStatus() {
  if (statusLoading) return;
  statusLoading = true;
  clearTimeout(statusTimer);
  try {
    const res = await fetch('/api/status', { cache: 'no-store' });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const body = await res.json();
    statusAttempt = 0;
    stats.info = body && typeof body.info === 'object' ? body.info : null;
    renderInfo(body);
  } catch {
    // The server is down or restarting: the streams show that; retry quietly with backoff.
    statusAttempt++;
    const delay = Math.min(30000, 1000 * 2 ** Math.min(statusAttempt, 5)) * (0.5 + Math.random() / 2);
    statusTimer = setTimeout(loadStatus, delay);
  } finally {
    statusLoading = false;
  }
}

function renderInfo(body) {
  const info = (body && body.info) || {};
  const list = (xs) =>
    Array.isArray(xs) && xs.length
      ? xs.map((x) => (x && typeof x === 'object' ? `${str(x.name)} (${str(x.kind)})` : str(x))).join(', ')
      : 'none';
  setText($('info-version'), str(info.version) || '?');
  setText($('info-engine'), str(info.engine) || '?');
  setText($('info-durability'), str(info.durability) || '?');
  setText($('info-sources'), list(info.sources));
  setText($('info-feeds'), list(info.feeds));
  setText($('info-data'), str(info.data) || '?');
  $('info-data').title = str(info.data);
  if (info.listen) document.title = `tailrace — ${str(info.listen)}`;
  stats.dirty = true;
  scheduleRender();
}

// ---------------------------------------------------------------------------------------------
// Statistics stream

/** The feed driving the rate chart and the top-k table: the first tailable feed. */
function primaryFeed() {
  const fromInfo = stats.info && Array.isArray(stats.info.feeds) ? stats.info.feeds : [];
  const tailable = fromInfo.find((f) => f && f.kind === 'tailable');
  if (tailable) return str(tailable.name);
  for (const [name, doc] of stats.feeds) if (doc && doc.kind === 'tailable') return name;
  return stats.feeds.size ? stats.feeds.keys().next().value : null;
}

/** Second of a document, from its own clock (the server's), so the browser's clock is moot. */
function secondOf(doc, msg) {
  const us = num(doc.updated_us) ?? num(msg.committed_at_us) ?? Date.now() * 1000;
  return Math.floor(us / 1e6);
}

function putRate(name, doc, x) {
  const s = (doc && doc.stats) || {};
  const b = s.rate_bands && typeof s.rate_bands === 'object' ? s.rate_bands : {};
  charts.rate.put(x, {
    rate: num(s.rate),
    upper: num(b.upper),
    middle: num(b.middle),
    lower: num(b.lower),
  });
}

function applyStats(msg) {
  if (!msg || typeof msg.key !== 'string') return;
  const key = msg.key;
  stats.dirty = true;
  if (msg.op === 'delete' || !msg.doc || typeof msg.doc !== 'object') {
    if (key === 'ingest') stats.ingest = null;
    else stats.feeds.delete(key);
    return;
  }
  const doc = msg.doc;
  const x = secondOf(doc, msg);
  stats.lastAt = performance.now();
  if (key === 'ingest') {
    stats.ingest = doc;
    const values = {};
    for (const [level, q] of Object.entries(doc.write_us || {})) {
      if (!q || typeof q !== 'object') continue;
      values[`${level} p50`] = num(q.p50);
      values[`${level} p99`] = num(q.p99);
    }
    if (Object.keys(values).length) charts.write.put(x, values);
    return;
  }
  stats.feeds.set(key, doc);
  const n = doc.notify_us;
  if (n && typeof n === 'object') {
    charts.notify.put(x, { [`${key} p50`]: num(n.p50), [`${key} p99`]: num(n.p99) });
  }
  const primary = primaryFeed();
  if (primary !== stats.rateFeed) {
    // The rate chart follows one feed; if that choice changes (the status arrived after
    // another feed's document), start its series over rather than mix two feeds.
    stats.rateFeed = primary;
    charts.rate.table.clear();
    const current = primary !== null ? stats.feeds.get(primary) : null;
    if (current) putRate(primary, current, secondOf(current, {}));
  } else if (key === primary) {
    putRate(key, doc, x);
  }
}

function onStatsEvent(ev) {
  switch (ev.type) {
    case 'initial':
    case 'change': {
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch (e) {
        console.warn('tailrace: a stats message is not JSON; skipped', e);
        return;
      }
      stats.received++;
      applyStats(msg);
      scheduleRender();
      break;
    }
    case 'gap':
      // The server could not resume us; it sends the current documents again, and the
      // charts simply have a hole: nothing to do but count it.
      stats.gaps++;
      break;
    default:
      break; // `state` and event types added later are not errors
  }
}

function onTrendEvent(ev) {
  if (ev.type !== 'initial' && ev.type !== 'change') return;
  let msg;
  try {
    msg = JSON.parse(ev.data);
  } catch (e) {
    console.warn('tailrace: a trends message is not JSON; skipped', e);
    return;
  }
  const doc = msg && msg.doc;
  if (!doc || doc.statistic !== 'rate' || typeof doc.feed !== 'string') return;
  const at = doc.at && typeof doc.at === 'object' ? Date.parse(doc.at.$date) : NaN;
  if (!Number.isFinite(at)) return;
  const x = Math.floor(at / 1000);
  // A document written again (a feed replaying after a restart) is the same mark.
  if (!trends.marks.some((m) => m.feed === doc.feed && m.x === x)) {
    trends.marks.push({ feed: doc.feed, x, dir: doc.direction === 'down' ? 'down' : 'up' });
    trends.marks.sort((a, b) => a.x - b.x);
    if (trends.marks.length > MAX_TRENDS) trends.marks.shift();
  }
  if (!trends.last || at >= Date.parse(trends.last.at.$date)) trends.last = doc;
  showLastTrend();
  charts.rate.table.dirty = true;
  scheduleRender();
}

/** The rate chart's feed's marks. */
function rateMarks() {
  return trends.marks.filter((m) => !stats.rateFeed || m.feed === stats.rateFeed);
}

function showLastTrend() {
  const d = trends.last;
  if (!d || (stats.rateFeed && d.feed !== stats.rateFeed)) return;
  const band = d.band && typeof d.band === 'object' ? d.band : {};
  const edge = d.direction === 'down' ? band.lower : band.upper;
  const clock = fmtClock(Date.parse(d.at.$date) * 1000).slice(0, 8);
  setText(
    $('trend-last'),
    `${d.direction === 'down' ? '▼' : '▲'} ${d.feed}'s rate broke out ${d.direction} at ${clock}: ` +
      `${fmtRate(num(d.rate))}/s, ${d.direction === 'down' ? 'below' : 'above'} ${fmtRate(num(edge))}/s`,
  );
}

// ---------------------------------------------------------------------------------------------
// Events stream

function eventsUrl(filter) {
  let url = `/api/changes?collection=events&include_initial=true&initial_limit=${INITIAL_EVENTS}`;
  if (filter) url += `&filter=${encodeURIComponent(filter)}`;
  return url;
}

/** Order of events in the list: the position when the key is one, else the commit time. */
function orderOf(msg) {
  if (/^\d{1,15}$/.test(msg.key)) return Number(msg.key);
  return num(msg.committed_at_us) ?? 0;
}

function remember(key) {
  if (events.recent.has(key)) return false;
  events.recent.add(key);
  events.recentRing.push(key);
  if (events.recentRing.length > RECENT_KEYS) events.recent.delete(events.recentRing.shift());
  return true;
}

function onEventsMessage(ev) {
  if (ev.type === 'gap') {
    events.gaps++;
    events.lastSeq.clear(); // numbers will jump: that is the gap, already reported
    let missed = '';
    try {
      const g = JSON.parse(ev.data);
      missed = num(g.missed) !== null ? `${fmtInt(g.missed)} events ` : '';
      missed += g.reason ? `(${str(g.reason)}) ` : '';
    } catch {
      // a gap without details is still a gap
    }
    setText($('events-note'), `${fmtClock(Date.now() * 1000)} — the server could not resume the stream: ${missed}not delivered.`);
    return;
  }
  if (ev.type !== 'initial' && ev.type !== 'change') return;
  let msg;
  try {
    msg = JSON.parse(ev.data);
  } catch (e) {
    console.warn('tailrace: an events message is not JSON; skipped', e);
    return;
  }
  if (!msg || typeof msg.key !== 'string') return;
  if (msg.op === 'delete' || !msg.doc || typeof msg.doc !== 'object') {
    events.removals.add(msg.key);
    scheduleRender();
    return;
  }
  events.received++;
  events.thisSecond++;
  if (!remember(msg.key)) {
    // A snapshot sent again (after a gap or a refused resume) repeats by design; a change
    // delivered twice is a broken resume.
    if (ev.type === 'change') events.duplicates++;
    return;
  }
  const stamp = msg.doc._tailrace;
  if (!events.filter && stamp && typeof stamp.source === 'string' && Number.isSafeInteger(stamp.seq)) {
    const last = events.lastSeq.get(stamp.source);
    if (last !== undefined && stamp.seq > last + 1) events.seqGaps += stamp.seq - last - 1;
    if (last === undefined || stamp.seq > last) events.lastSeq.set(stamp.source, stamp.seq);
  }
  events.pending.push({ msg, raw: ev.data, order: orderOf(msg) });
  if (events.pending.length > MAX_EVENTS) events.pending.splice(0, events.pending.length - MAX_EVENTS);
  scheduleRender();
}

function eventRow(item) {
  const { msg } = item;
  const d = msg.doc;
  const stamp = d._tailrace && typeof d._tailrace === 'object' ? d._tailrace : {};
  const us = num(stamp.ingested_us) ?? num(msg.committed_at_us) ?? Date.now() * 1000;
  const user = d.user && typeof d.user === 'object' ? str(d.user.screen_name ?? d.user.name ?? d.user.id) : str(d.user);
  const text = d.text !== undefined ? str(d.text) : JSON.stringify(d).slice(0, 400);
  const rt = num(d.retweet_count);
  const lang = str(d.lang);
  const geo = stamp.geo && typeof stamp.geo === 'object' ? stamp.geo : {};
  const summary = el(
    'summary',
    {},
    el('time', { datetime: new Date(us / 1000).toISOString() }, fmtClock(us)),
    // The name is isolated (its own direction) so an RTL name keeps the @ on the left.
    el('span', { class: 'user', title: user }, ...(user ? ['@', el('bdi', {}, user)] : [])),
    el('span', { class: 'lang' }, lang),
    el('span', { class: 'rt', title: 'retweets' }, rt ? `${fmtInt(rt)}↻` : ''),
    el('span', { class: 'text', dir: 'auto' }, text),
  );
  const li = el('li', { dataset: { key: msg.key, lang, country: str(geo.country) } }, el('details', {}, summary));
  li.dataset.order = String(item.order);
  events.raw.set(li, item.raw);
  return li;
}

/** Opening an event shows its whole document, built only then. */
function onToggle(e) {
  const details = e.target;
  if (!(details instanceof HTMLDetailsElement) || !details.open || details.querySelector('pre')) return;
  const li = details.closest('li');
  const raw = li && events.raw.get(li);
  if (!raw) return;
  let text;
  try {
    text = JSON.stringify(parseExact(raw).doc, null, 2);
  } catch {
    text = raw;
  }
  details.append(el('pre', { dir: 'ltr' }, text));
}

function renderEvents() {
  const list = $('events');
  if (events.clear) {
    events.clear = false;
    list.replaceChildren();
    events.shown.clear();
  }
  for (const key of events.removals) {
    const li = events.shown.get(key);
    if (li) {
      li.remove();
      events.shown.delete(key);
    }
  }
  events.removals.clear();
  if (!events.paused && events.pending.length) {
    const items = events.pending.filter((it) => !events.shown.has(it.msg.key));
    events.pending = [];
    items.sort((a, b) => b.order - a.order); // newest first
    const top = list.firstElementChild;
    const topOrder = top ? Number(top.dataset.order) : -Infinity;
    if (items.length && items[items.length - 1].order > topOrder) {
      // The usual case: everything new is newer than the list. One insertion.
      const frag = document.createDocumentFragment();
      for (const it of items) {
        const li = eventRow(it);
        events.shown.set(it.msg.key, li);
        frag.append(li);
      }
      list.prepend(frag);
    } else {
      // Older events (a resent initial batch): put each in its place.
      for (const it of items) {
        const li = eventRow(it);
        events.shown.set(it.msg.key, li);
        let at = list.firstElementChild;
        while (at && Number(at.dataset.order) > it.order) at = at.nextElementSibling;
        list.insertBefore(li, at);
      }
    }
    while (list.childElementCount > MAX_EVENTS) {
      const last = list.lastElementChild;
      events.shown.delete(last.dataset.key);
      last.remove();
    }
  }
  const rate = events.perSecond.length
    ? events.perSecond.reduce((a, b) => a + b, 0) / events.perSecond.length
    : 0;
  let label = `${list.childElementCount} shown · ${fmtRate(rate)}/s`;
  if (events.filter) label += ' · filtered';
  if (events.paused) label += ` · paused, ${events.pending.length}${events.pending.length >= MAX_EVENTS ? '+' : ''} new`;
  setText($('events-count'), label);
}

/** Opens the events stream for `filter`; it replaces the current one once the server accepts. */
function openEvents(filter) {
  if (events.candidate) events.candidate.stop();
  const candidate = new SseStream({
    url: eventsUrl(filter),
    idleMs: EVENTS_IDLE_MS,
    onEvent: (ev) => {
      if (events.stream === candidate) onEventsMessage(ev);
    },
    onState: (state, detail) => {
      if (state === 'open' && events.candidate === candidate) {
        // Accepted: swap. The old list belongs to the old filter.
        if (events.stream) events.stream.stop();
        events.stream = candidate;
        events.candidate = null;
        events.filter = filter;
        events.pending = [];
        events.removals.clear();
        events.recent.clear();
        events.recentRing.length = 0;
        events.lastSeq.clear();
        events.clear = true;
        showFilterError('');
        setText($('events-note'), '');
        const url = filter ? `?filter=${encodeURIComponent(filter)}` : location.pathname;
        history.replaceState(null, '', url);
        onFilterApplied(filter);
        scheduleRender();
      } else if (state === 'failed') {
        if (events.candidate === candidate) {
          events.candidate = null;
          showFilterError(`${detail.message}`);
        } else if (events.stream === candidate) {
          setText($('events-note'), `The server refused the events stream: ${detail.message}`);
        }
      } else if (state === 'resync' && events.stream === candidate) {
        // The server does not know our id: it is another history (restarted without its
        // data), whose positions may be lower than the ones shown. Start the list over, or
        // old events would sit on top of the new ones for good.
        events.clear = true;
        events.pending = [];
        events.recent.clear();
        events.recentRing.length = 0;
        events.lastSeq.clear();
        setText($('events-note'), `${fmtClock(Date.now() * 1000)} — resume refused (${detail.message}); started over.`);
      }
      updateConnection();
    },
  });
  events.candidate = candidate;
  candidate.start();
}

function showFilterError(message) {
  setText($('filter-error'), message);
  $('filter').setAttribute('aria-invalid', message ? 'true' : 'false');
}

function submitFilter(e) {
  e.preventDefault();
  const text = $('filter').value.trim();
  if (text) {
    // JSON syntax is checked here for an instant answer; what the filter means is the
    // server's to judge (its 400 message is shown as it is).
    let parsed;
    try {
      parsed = JSON.parse(text);
    } catch (err) {
      showFilterError(`not JSON: ${err instanceof Error ? err.message : String(err)}`);
      return;
    }
    if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
      showFilterError('a filter is a JSON object, e.g. {"lang":"ja"}');
      return;
    }
  }
  showFilterError('');
  openEvents(text);
}

// ---------------------------------------------------------------------------------------------
// Rendering (at most once per frame)

function syncRows(tbody, rows) {
  while (tbody.rows.length > rows.length) tbody.deleteRow(-1);
  rows.forEach((cells, r) => {
    const tr = tbody.rows[r] || tbody.insertRow();
    while (tr.cells.length > cells.length) tr.deleteCell(-1);
    cells.forEach((c, i) => {
      const td = tr.cells[i] || tr.insertCell();
      const cls = c.cls || '';
      if (td.className !== cls) td.className = cls;
      if (c.bar !== undefined) {
        let bar = td.firstElementChild;
        if (!bar) td.append((bar = el('div', { class: 'bar' })));
        bar.style.width = `${(c.bar * 100).toFixed(1)}%`;
        return;
      }
      setText(td, c.text);
      if (c.dir && td.dir !== c.dir) td.dir = c.dir;
      if (c.title !== undefined && td.title !== c.title) td.title = c.title;
    });
  });
}

function renderTables() {
  const order = [];
  const infoFeeds = stats.info && Array.isArray(stats.info.feeds) ? stats.info.feeds : [];
  for (const f of infoFeeds) if (f && stats.feeds.has(str(f.name))) order.push(str(f.name));
  for (const name of stats.feeds.keys()) if (!order.includes(name)) order.push(name);
  syncRows(
    $('feeds').tBodies[0],
    order.map((name) => {
      const d = stats.feeds.get(name);
      const s = (d && d.stats) || {};
      const n = (d && d.notify_us) || {};
      const lag = num(d.lag);
      return [
        { text: name, dir: 'auto' },
        { text: str(d.kind) },
        { text: fmtInt(s.events), cls: 'num' },
        { text: fmtRate(s.rate), cls: 'num' },
        { text: lag === null ? '–' : fmtInt(lag), cls: lag !== null && lag >= 1000 ? 'num warn' : 'num' },
        { text: fmtInt(s.missing), cls: s.missing > 0 ? 'num bad' : 'num' },
        { text: fmtInt(s.duplicates), cls: s.duplicates > 0 ? 'num bad' : 'num' },
        { text: fmtUs(n.p50), cls: 'num' },
        { text: fmtUs(n.p99), cls: 'num' },
      ];
    }),
  );

  const primary = stats.rateFeed;
  const pdoc = primary !== null ? stats.feeds.get(primary) : null;
  const top = pdoc && pdoc.stats && Array.isArray(pdoc.stats.top) ? pdoc.stats.top : [];
  const entries = top.filter((t) => t !== null && typeof t === 'object' && 'key' in t);
  const max = Math.max(1, ...entries.map((t) => num(t.count) ?? 0));
  setText($('topk-source'), primary ? `of feed ${primary}` : '');
  syncRows(
    $('topk').tBodies[0],
    entries.map((t, i) => {
      const value = str(t.key);
      return [
        { text: String(i + 1), cls: 'num' },
        { text: value, cls: 'value', dir: 'auto', title: value },
        { text: fmtInt(t.count), cls: 'num' },
        { bar: (num(t.count) ?? 0) / max, cls: 'bar-col' },
      ];
    }),
  );

  const ing = stats.ingest || {};
  setText($('kpi-rate'), fmtRate(ing.rate));
  setText($('kpi-written'), fmtInt(ing.written));
  setText($('kpi-rejected'), fmtInt(ing.rejected));
  setText($('kpi-queue'), fmtInt(ing.queue_depth));
  $('kpi-rejected').className = ing.rejected > 0 ? 'warn' : '';
}

function renderStreams() {
  const row = (name, s, received, extra) => {
    const state = s ? s.state : 'connecting';
    return [
      { text: name },
      { text: state, cls: state === 'open' ? '' : state === 'failed' ? 'bad' : 'warn' },
      { text: fmtInt(s ? s.connections : 0), cls: 'num' },
      { text: s && s.lastEventId ? s.lastEventId : '–', cls: 'value', title: s ? s.lastEventId : '' },
      { text: fmtInt(received), cls: 'num' },
      ...extra,
    ];
  };
  const bad = (n) => ({ text: fmtInt(n), cls: n > 0 ? 'num bad' : 'num' });
  const dash = { text: '–', cls: 'num' };
  syncRows($('streams').tBodies[0], [
    row('stats', stats.stream, stats.received, [dash, dash, bad(stats.gaps)]),
    row(
      events.filter ? 'events (filtered)' : 'events',
      events.stream || events.candidate,
      events.received,
      [bad(events.duplicates), events.filter ? dash : bad(events.seqGaps), bad(events.gaps)],
    ),
  ]);
}

function render() {
  renderPending = false;
  lastRender = performance.now();
  for (const c of Object.values(charts)) c.render();
  if (stats.dirty) {
    stats.dirty = false;
    renderTables();
  }
  const rate = events.perSecond.length ? events.perSecond.reduce((a, b) => a + b, 0) / events.perSecond.length : 0;
  if (rate <= BUSY_RATE || lastRender - lastListRender >= BUSY_LIST_INTERVAL_MS) {
    lastListRender = lastRender;
    renderEvents();
  }
}

// ---------------------------------------------------------------------------------------------
// Connection indicator and the one-second ticker

function updateConnection() {
  const s = stats.stream ? stats.stream.state : 'connecting';
  const e = events.stream ? events.stream.state : events.candidate ? events.candidate.state : 'connecting';
  let state;
  let text;
  if (s === 'failed' || e === 'failed') {
    state = 'failed';
    text = 'refused';
  } else if (s === 'reconnecting' || e === 'reconnecting') {
    state = 'reconnecting';
    text = 'reconnecting';
  } else if (s === 'open' && e === 'open') {
    const stale = stats.lastAt > 0 && performance.now() - stats.lastAt > STALE_AFTER_MS;
    state = stale ? 'stale' : 'live';
    text = stale ? 'stale' : 'live';
  } else {
    state = 'connecting';
    text = 'connecting';
  }
  const conn = $('conn');
  if (conn.dataset.state !== state) conn.dataset.state = state;
  setText(conn, text);
  conn.title = `statistics: ${s}, events: ${e}`;
}

function tick() {
  events.perSecond.push(events.thisSecond);
  events.thisSecond = 0;
  if (events.perSecond.length > 5) events.perSecond.shift();
  setText($('kpi-age'), stats.lastAt ? fmtAge(performance.now() - stats.lastAt) : '–');
  const age = $('kpi-age');
  const stale = stats.lastAt > 0 && performance.now() - stats.lastAt > STALE_AFTER_MS;
  if (age.className !== (stale ? 'warn' : '')) age.className = stale ? 'warn' : '';
  updateConnection();
  renderStreams(); // counters change with every event: once a second is enough to read them
  scheduleRender();
}

// ---------------------------------------------------------------------------------------------
// Start

function start() {
  if (typeof uPlot !== 'function') {
    setText($('conn'), 'chart library missing');
    $('conn').dataset.state = 'failed';
    return;
  }
  charts.rate = new Chart($('chart-rate'), {
    zeroBased: true,
    yFormat: (v) => fmtRate(v),
    series: (keys) =>
      keys.map((key) => {
        const band = key !== 'rate';
        return {
          label: key,
          stroke: band ? css('--muted') : css('--s1'),
          width: band ? 1 : 1.75,
          dash: key === 'middle' ? [4, 3] : undefined,
          spanGaps: true,
          value: (u, v) => fmtRate(v),
          points: { show: false },
        };
      }),
    bands: (keys) => {
      const up = keys.indexOf('upper') + 1;
      const low = keys.indexOf('lower') + 1;
      return up > 0 && low > 0 ? [{ series: [up, low], fill: css('--band') }] : [];
    },
    marks: rateMarks,
  });
  charts.notify = new Chart($('chart-notify'), { log: true, yFormat: fmtUsAxis, series: quantileSeries });
  charts.write = new Chart($('chart-write'), { log: true, yFormat: fmtUsAxis, series: quantileSeries });
  for (const c of Object.values(charts)) c.render();

  // One observer and one media listener for the page's life; nothing is added on reconnect.
  new ResizeObserver(() => {
    for (const c of Object.values(charts)) c.resize();
  }).observe(document.querySelector('.charts'));
  matchMedia('(prefers-color-scheme: dark)').addEventListener('change', () => {
    for (const c of Object.values(charts)) c.restyle();
  });
  startQuery();
  $('events').addEventListener('toggle', onToggle, true); // toggle does not bubble
  $('filter-form').addEventListener('submit', submitFilter);
  for (const b of document.querySelectorAll('button.example')) {
    b.addEventListener('click', () => {
      $('filter').value = b.dataset.filter || '';
      $('filter-form').requestSubmit();
    });
  }
  $('pause').addEventListener('click', () => {
    events.paused = !events.paused;
    $('pause').setAttribute('aria-pressed', String(events.paused));
    setText($('pause'), events.paused ? 'Resume' : 'Pause');
    scheduleRender();
  });

  loadStatus();
  stats.stream = new SseStream({
    url: '/api/changes?collection=stats&include_initial=true',
    idleMs: STATS_IDLE_MS,
    onEvent: onStatsEvent,
    onState: (state) => {
      if (state === 'resync') {
        // Another history: feeds it no longer has must leave the tables.
        stats.feeds.clear();
        stats.ingest = null;
        stats.dirty = true;
      }
      // After a reconnect the server may be a new process: read its status again.
      if (state === 'open' && stats.stream && stats.stream.connections > 1) loadStatus();
      updateConnection();
    },
  });
  stats.stream.start();
  trends.stream = new SseStream({
    url: '/api/changes?collection=trends&include_initial=true',
    idleMs: STATS_IDLE_MS,
    onEvent: onTrendEvent,
  });
  trends.stream.start();

  const initial = new URLSearchParams(location.search).get('filter') || '';
  $('filter').value = initial;
  openEvents(initial.trim());
  // A country clicked on the map filters the list as the box would.
  startMap((filter) => {
    $('filter').value = filter;
    $('filter-form').requestSubmit();
  });
  setInterval(tick, 1000);

  // For tests and for an operator's console: what the page has seen, and a way to drop the
  // connections as a network failure would (they resume after their last event id).
  window.tailrace = Object.freeze({
    snapshot: () => ({
      trends: { marks: rateMarks().length, state: trends.stream.state },
      stats: {
        state: stats.stream.state,
        connections: stats.stream.connections,
        lastEventId: stats.stream.lastEventId,
        gaps: stats.gaps,
      },
      events: {
        state: events.stream ? events.stream.state : null,
        connections: events.stream ? events.stream.connections : 0,
        lastEventId: events.stream ? events.stream.lastEventId : '',
        received: events.received,
        duplicates: events.duplicates,
        seqGaps: events.seqGaps,
        gaps: events.gaps,
        filter: events.filter,
        shown: $('events').childElementCount,
      },
      points: Object.fromEntries(Object.entries(charts).map(([k, c]) => [k, c.table.xs.length])),
      query: querySnapshot(),
      map: mapSnapshot(),
    }),
    drop: () => {
      stats.stream.drop('dropped on request');
      if (events.stream) events.stream.drop('dropped on request');
      dropMap('dropped on request');
    },
  });
}

start();
