// Tests of the page's event-stream client (server/static/sse.js), run by node's test runner:
//   node --test server/static-dev/
// The stream tests talk to a real HTTP server on 127.0.0.1:0, not a stub of fetch.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { SseParser, SseStream, backoffMs } from '../static/sse.js';

/** Parses `text` split into the given chunk sizes; returns the dispatched events. */
function parseInChunks(text, sizes) {
  const events = [];
  const p = new SseParser((ev) => events.push(ev));
  let at = 0;
  let i = 0;
  while (at < text.length) {
    const n = sizes[i++ % sizes.length];
    p.push(text.slice(at, at + n));
    at += n;
  }
  return { events, parser: p };
}

const STREAM =
  '\ufeff: keep-alive comment\r\n' +
  'id: e-1\r\nevent: initial\r\ndata: {"key":"1","doc":{"text":"مرحبا بالعالم 👋🏽"}}\r\n\r\n' +
  'id: e-2\revent: change\rdata: {"key":"$weird.key","doc":{"text":"東京 🚀 #rust"}}\r\r' +
  'event: state\ndata: {"state":"ready"}\n\n' +
  'data: line one\ndata:line two\ndata\n\n' +
  'id: e-3\nretry: 2500\nevent: gap\ndata: {"reason":"history_lost","missed":123}\n\n' +
  'id\nunknown: field\n\n' +
  'data: not dispatched without a blank line';

const EXPECTED = [
  { type: 'initial', data: '{"key":"1","doc":{"text":"مرحبا بالعالم 👋🏽"}}', id: 'e-1' },
  { type: 'change', data: '{"key":"$weird.key","doc":{"text":"東京 🚀 #rust"}}', id: 'e-2' },
  { type: 'state', data: '{"state":"ready"}', id: 'e-2' },
  { type: 'message', data: 'line one\nline two\n', id: 'e-2' },
  { type: 'gap', data: '{"reason":"history_lost","missed":123}', id: 'e-3' },
];

test('the parser yields the same events whatever the chunk boundaries', () => {
  // Every split point matters: inside a CRLF, inside a surrogate pair, inside a field name.
  for (const sizes of [[STREAM.length], [1], [2], [3], [7], [1, 5, 2], [13, 1, 1]]) {
    const { events, parser } = parseInChunks(STREAM, sizes);
    assert.deepEqual(events, EXPECTED, `chunk sizes ${JSON.stringify(sizes)}: events differ`);
    assert.equal(parser.lastEventId, '', `an empty id field resets the last id; saw ${parser.lastEventId}`);
    assert.equal(parser.retryMs, 2500, `retry: 2500 read; saw ${parser.retryMs}`);
  }
});

test('a CR at the end of a chunk and an LF at the start of the next are one line break', () => {
  const { events } = parseInChunks('data: a\r\n\r\ndata: b\r\n\r\n', [8, 1, 1, 9]);
  assert.deepEqual(
    events.map((e) => e.data),
    ['a', 'b'],
    `expected two events a, b; saw ${JSON.stringify(events)}`,
  );
});

test('resetConnection drops a half-received event but keeps the last id', () => {
  const events = [];
  const p = new SseParser((ev) => events.push(ev));
  p.push('id: 41\ndata: whole\n\nid: 42\ndata: half');
  p.resetConnection();
  p.push('data: after\n\n');
  assert.deepEqual(
    events.map((e) => [e.data, e.id]),
    [
      ['whole', '41'],
      ['after', '42'],
    ],
    'the cut event is lost, the id line that did arrive counts',
  );
});

test('backoff grows, is capped and keeps half of its step fixed', () => {
  const lows = [1, 2, 3, 4, 5, 10].map((a) => backoffMs(a, 500, 15000, () => 0));
  const highs = [1, 2, 3, 4, 5, 10].map((a) => backoffMs(a, 500, 15000, () => 1));
  assert.deepEqual(lows, [250, 500, 1000, 2000, 4000, 7500], `low ends: ${lows}`);
  assert.deepEqual(highs, [500, 1000, 2000, 4000, 8000, 15000], `high ends: ${highs}`);
});

/** A real server: `handler(req, res, n)` with n the request count; returns the base URL. */
async function serve(handler) {
  let n = 0;
  const server = http.createServer((req, res) => handler(req, res, ++n));
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return { url: `http://127.0.0.1:${port}/`, server };
}

/** Fails the test rather than hanging it. */
function within(ms, promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

test('after a drop the stream reconnects and sends Last-Event-ID', async () => {
  const seen = [];
  const { url, server } = await serve((req, res, n) => {
    seen.push(req.headers['last-event-id'] ?? null);
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    if (n === 1) {
      res.end('id: a1\ndata: one\n\nid: a2\ndata: two\n\n'); // then the server "drops" us
    } else {
      res.write('id: a3\ndata: three\n\n');
    }
  });
  const events = [];
  let resolveThree;
  const three = new Promise((r) => (resolveThree = r));
  const states = [];
  const s = new SseStream({
    url,
    minDelayMs: 20,
    onEvent: (ev) => {
      events.push(ev.data);
      if (ev.data === 'three') resolveThree();
    },
    onState: (st) => states.push(st),
  });
  const done = s.start();
  try {
    await within(5000, three, 'the event of the second connection');
    assert.deepEqual(events, ['one', 'two', 'three'], `events in order, once each; saw ${events}`);
    assert.deepEqual(seen, [null, 'a2'], `first request without id, second after a2; saw ${seen}`);
    assert.ok(states.includes('reconnecting'), `a reconnecting state was reported; saw ${states}`);
  } finally {
    s.stop();
    await within(5000, done, 'the stream loop to end');
    server.closeAllConnections();
    server.close();
  }
  assert.equal(s.state, 'stopped', `stopped after stop(); saw ${s.state}`);
});

test('a 400 answer fails the stream with the server message and no retry', async () => {
  let requests = 0;
  const { url, server } = await serve((req, res) => {
    requests++;
    res.writeHead(400, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: 'filter at $and[0]: unknown operator $nope' }));
  });
  let failed = null;
  const s = new SseStream({
    url,
    minDelayMs: 20,
    onEvent: () => {},
    onState: (st, d) => {
      if (st === 'failed') failed = d;
    },
  });
  try {
    await within(5000, s.start(), 'the stream to fail');
    assert.deepEqual(
      failed,
      { status: 400, message: 'filter at $and[0]: unknown operator $nope' },
      `failed with the server message; saw ${JSON.stringify(failed)}`,
    );
    assert.equal(requests, 1, `one request, no retry of a refused one; saw ${requests}`);
  } finally {
    s.stop();
    server.close();
  }
});

test('a resume id the server refuses is dropped once and the stream starts over', async () => {
  const seen = [];
  const { url, server } = await serve((req, res, n) => {
    seen.push(req.headers['last-event-id'] ?? null);
    if (n === 2) {
      res.writeHead(400, { 'content-type': 'application/json' });
      res.end('{"error":"resume_after: unknown id"}');
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    if (n === 1) res.end('id: old-7\ndata: before\n\n');
    else res.write('id: new-1\ndata: fresh\n\n');
  });
  let resolveFresh;
  const fresh = new Promise((r) => (resolveFresh = r));
  const s = new SseStream({
    url,
    minDelayMs: 20,
    onEvent: (ev) => ev.data === 'fresh' && resolveFresh(),
  });
  const done = s.start();
  try {
    await within(5000, fresh, 'the event after starting over');
    assert.deepEqual(seen, [null, 'old-7', null], `resume, refused, fresh start; saw ${seen}`);
  } finally {
    s.stop();
    await within(5000, done, 'the stream loop to end');
    server.closeAllConnections();
    server.close();
  }
});

test('the idle watchdog reconnects a connection that went silent', async () => {
  let requests = 0;
  const { url, server } = await serve((req, res) => {
    requests++;
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(`id: s${requests}\ndata: hello ${requests}\n\n`); // then silence, socket open
  });
  let resolveSecond;
  const second = new Promise((r) => (resolveSecond = r));
  const s = new SseStream({
    url,
    idleMs: 200,
    minDelayMs: 20,
    onEvent: (ev) => ev.data === 'hello 2' && resolveSecond(),
  });
  const done = s.start();
  try {
    await within(5000, second, 'a second connection after the first went silent');
    assert.ok(s.connections >= 2, `at least two connections; saw ${s.connections}`);
  } finally {
    s.stop();
    await within(5000, done, 'the stream loop to end');
    server.closeAllConnections();
    server.close();
  }
});
