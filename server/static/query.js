// The page's question box: a pipeline in MongoDB's aggregation language, sent to
// `POST /api/aggregate` over one collection; the answer shown as a table, and drawn as a
// chart when it is bucketed by time (every row's `_id` a date, as `$dateTrunc` gives).
//
// Data never goes through an HTML parser: every cell is a text node.

/** Rows and columns shown at most: the answer itself may hold more (the meta line says so). */
const MAX_ROWS = 500;
const MAX_COLUMNS = 12;
const CHART_HEIGHT = 170;

const $ = (id) => document.getElementById(id);

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

/** A date as extended JSON writes it (`{"$date": "..."}`), in seconds; otherwise null. */
function dateSeconds(v) {
  if (!v || typeof v !== 'object' || Array.isArray(v) || Object.keys(v).length !== 1) return null;
  const d = v.$date;
  const ms = typeof d === 'string' ? Date.parse(d) : null;
  return Number.isFinite(ms) ? ms / 1000 : null;
}

/** A cell's text: strings as they are, dates as their time, anything else as JSON. */
function cellText(v) {
  if (typeof v === 'string') return v;
  if (v === undefined || v === null) return '';
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  if (dateSeconds(v) !== null) return v.$date;
  return JSON.stringify(v);
}

/** The top-level keys of the rows, in the order they first appear. */
function columnsOf(rows) {
  const cols = [];
  for (const r of rows) {
    if (!r || typeof r !== 'object') continue;
    for (const k of Object.keys(r)) if (!cols.includes(k)) cols.push(k);
    if (cols.length >= MAX_COLUMNS) break;
  }
  return cols.slice(0, MAX_COLUMNS);
}

const state = { chart: null, busy: null, runs: 0 };

function showError(message) {
  $('query-error').textContent = message;
  $('query').setAttribute('aria-invalid', message ? 'true' : 'false');
}

function renderTable(rows) {
  const table = $('query-result');
  const cols = columnsOf(rows);
  const head = document.createElement('tr');
  for (const c of cols) {
    const th = document.createElement('th');
    th.scope = 'col';
    th.textContent = c;
    head.append(th);
  }
  table.tHead.replaceChildren(head);
  const body = [];
  for (const r of rows.slice(0, MAX_ROWS)) {
    const tr = document.createElement('tr');
    for (const c of cols) {
      const td = document.createElement('td');
      const v = r ? r[c] : undefined;
      td.textContent = cellText(v);
      if (typeof v === 'number') td.className = 'num';
      else td.dir = 'auto';
      tr.append(td);
    }
    body.push(tr);
  }
  table.tBodies[0].replaceChildren(...body);
}

/** A chart of the numeric fields over time, when every row's `_id` is a date. */
function renderChart(rows) {
  const node = $('query-chart');
  if (state.chart) {
    state.chart.destroy();
    state.chart = null;
  }
  const xs = rows.map((r) => dateSeconds(r && r._id));
  const fields = columnsOf(rows).filter((c) => c !== '_id' && rows.some((r) => typeof r[c] === 'number'));
  const timed = rows.length > 0 && xs.every((x) => x !== null) && fields.length > 0 && typeof uPlot === 'function';
  node.hidden = !timed;
  node.dataset.points = timed ? String(rows.length) : '0';
  if (!timed) return;
  const palette = ['--s1', '--s2', '--s3', '--s4', '--s5', '--s6'];
  const grid = { stroke: css('--grid'), width: 1 };
  state.chart = new uPlot(
    {
      width: Math.max(200, node.clientWidth),
      height: CHART_HEIGHT,
      scales: { x: { time: true } },
      axes: [
        { stroke: css('--muted'), grid, ticks: grid, size: 28 },
        { stroke: css('--muted'), grid, ticks: grid, size: 52 },
      ],
      series: [
        { label: '_id' },
        ...fields.map((f, i) => ({ label: f, stroke: css(palette[i % palette.length]), width: 1.5, points: { show: rows.length < 60 } })),
      ],
    },
    [xs, ...fields.map((f) => rows.map((r) => (typeof r[f] === 'number' ? r[f] : null)))],
    node,
  );
}

async function run(e) {
  if (e) e.preventDefault();
  const text = $('query').value.trim() || $('query').placeholder;
  let pipeline;
  try {
    pipeline = JSON.parse(text);
  } catch (err) {
    showError(`not JSON: ${err.message}`);
    return;
  }
  const collection = $('query-collection').value;
  if (state.busy) state.busy.abort();
  const busy = new AbortController();
  state.busy = busy;
  $('query-meta').textContent = 'asking…';
  try {
    const res = await fetch('/api/aggregate', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ collection, pipeline }),
      signal: busy.signal,
    });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) {
      showError(body.error || `HTTP ${res.status}`);
      $('query-meta').textContent = '';
      return;
    }
    showError('');
    const rows = Array.isArray(body.docs) ? body.docs : [];
    renderTable(rows);
    renderChart(rows);
    const where = (body.stages || []).map((s) => `${s.stage} in ${s.ran}`).join(', ');
    const shown = rows.length > MAX_ROWS ? ` (first ${MAX_ROWS} shown)` : '';
    $('query-meta').textContent =
      `${rows.length} rows${shown} · read ${body.read} from ${body.collection} in ${Math.round(body.took_ms)} ms` +
      (where ? ` · ${where}` : '');
    state.runs++;
  } catch (err) {
    if (err.name === 'AbortError') return;
    showError(`the query could not be sent: ${err.message}`);
    $('query-meta').textContent = '';
  } finally {
    if (state.busy === busy) state.busy = null;
  }
}

/** Wires the question box; call once. */
export function startQuery() {
  $('query-form').addEventListener('submit', run);
  $('query').addEventListener('keydown', (e) => {
    // Ctrl/Cmd+Enter runs the pipeline; Enter alone is a new line in it.
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) $('query-form').requestSubmit();
  });
  for (const b of document.querySelectorAll('button.query-example')) {
    b.addEventListener('click', () => {
      $('query').value = b.dataset.query || '';
      $('query-form').requestSubmit();
    });
  }
}

/** What the box has shown, for tests. */
export function querySnapshot() {
  return { runs: state.runs, chartPoints: Number($('query-chart').dataset.points || 0) };
}
