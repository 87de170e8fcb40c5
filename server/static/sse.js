// Server-sent events over fetch(): a parser that follows the WHATWG event-stream rules, and a
// stream that reconnects with backoff and sends Last-Event-ID itself.
//
// Why not EventSource: it hides the body of an error response (the page must show the
// server's 400 message for a bad filter), it cannot set headers, and its reconnect policy is
// fixed (no backoff, no jitter). This module has no DOM dependency, so node runs its tests
// (server/static-dev/sse.test.mjs).

/** Longest line the parser buffers before giving up on a connection (a runaway server). */
export const MAX_LINE_CHARS = 16 * 1024 * 1024;

/**
 * Incremental event-stream parser. Feed it decoded text in chunks of any size (a chunk may
 * end inside a line, or between the CR and LF of a CRLF); it calls
 * `onEvent({type, data, id})` once per dispatched event.
 */
export class SseParser {
  /** @param {(ev: {type: string, data: string, id: string}) => void} onEvent */
  constructor(onEvent) {
    this.onEvent = onEvent;
    /** The last event id seen; it survives reconnects (it is what Last-Event-ID sends). */
    this.lastEventId = '';
    /** Reconnection delay the server asked for with `retry:`, in ms, or null. */
    this.retryMs = null;
    this.resetConnection();
  }

  /** Forgets partial input: called when a new connection starts. The last id is kept. */
  resetConnection() {
    this.buf = '';
    this.data = [];
    this.type = '';
    // A CR ended the previous chunk: an LF starting the next one belongs to it (CRLF).
    this.skipLf = false;
    this.started = false;
  }

  /** @param {string} chunk decoded text */
  push(chunk) {
    if (!this.started && chunk.length > 0) {
      this.started = true;
      if (chunk.charCodeAt(0) === 0xfeff) chunk = chunk.slice(1); // a leading BOM is ignored
    }
    if (this.skipLf && chunk.length > 0) {
      if (chunk.charCodeAt(0) === 0x0a) chunk = chunk.slice(1);
      this.skipLf = false;
    }
    const text = this.buf + chunk;
    let start = 0;
    const n = text.length;
    for (let i = 0; i < n; i++) {
      const c = text.charCodeAt(i);
      if (c !== 0x0a && c !== 0x0d) continue;
      this.line(text.slice(start, i));
      if (c === 0x0d) {
        if (i + 1 < n) {
          if (text.charCodeAt(i + 1) === 0x0a) i++;
        } else {
          this.skipLf = true;
        }
      }
      start = i + 1;
    }
    this.buf = start < n ? text.slice(start) : '';
    if (this.buf.length > MAX_LINE_CHARS) {
      this.buf = '';
      throw new Error(`event-stream line longer than ${MAX_LINE_CHARS} characters`);
    }
  }

  /** One complete line, without its terminator. */
  line(line) {
    if (line === '') {
      this.dispatch();
      return;
    }
    if (line.charCodeAt(0) === 0x3a) return; // ':' starts a comment (keep-alives)
    const colon = line.indexOf(':');
    let field = line;
    let value = '';
    if (colon >= 0) {
      field = line.slice(0, colon);
      value = line.slice(colon + 1);
      if (value.charCodeAt(0) === 0x20) value = value.slice(1);
    }
    switch (field) {
      case 'data':
        this.data.push(value);
        break;
      case 'event':
        this.type = value;
        break;
      case 'id':
        if (!value.includes('\u0000')) this.lastEventId = value;
        break;
      case 'retry':
        if (/^[0-9]+$/.test(value)) this.retryMs = Number(value);
        break;
      default:
        break; // unknown fields are ignored, as the spec says
    }
  }

  dispatch() {
    if (this.data.length === 0) {
      this.type = '';
      return;
    }
    const ev = { type: this.type || 'message', data: this.data.join('\n'), id: this.lastEventId };
    this.data = [];
    this.type = '';
    this.onEvent(ev);
  }
}

/** Thrown for an HTTP error answer, carrying the server's message. */
export class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.name = 'HttpError';
    this.status = status;
  }
}

/** Reads the `error` of a JSON error body, else the text, else the status line. */
async function errorMessage(res) {
  let text = '';
  try {
    text = await res.text();
  } catch {
    // the body could not be read: the status line is all there is
  }
  try {
    const body = JSON.parse(text);
    if (body && typeof body.error === 'string') return body.error;
  } catch {
    // not JSON: show the text as it is
  }
  return text.trim().slice(0, 500) || `HTTP ${res.status} ${res.statusText}`;
}

/**
 * Backoff before reconnect attempt `attempt` (1, 2, ...): exponential from `minMs`, capped
 * at `maxMs`, with "equal jitter" (half fixed, half random) so that many pages that lost the
 * same server do not all come back in the same millisecond, yet none retries at once.
 */
export function backoffMs(attempt, minMs, maxMs, random = Math.random) {
  const cap = Math.min(maxMs, minMs * 2 ** Math.max(0, attempt - 1));
  return Math.round(cap / 2 + random() * (cap / 2));
}

/**
 * One logical event stream: connects, parses, reconnects after a drop with backoff and
 * jitter, resuming after the last id it saw.
 *
 * States reported through `onState(state, detail)`:
 * `connecting` → `open` → (`reconnecting` {delayMs, reason} → `connecting` → `open`)* →
 * `stopped`, or `failed` {status, message} when the server refused the request (4xx): the
 * stream then stops, since asking again would get the same answer.
 */
export class SseStream {
  /**
   * @param {object} o
   * @param {string} o.url the request URL (Last-Event-ID goes in a header, not here)
   * @param {(ev: {type: string, data: string, id: string}) => void} o.onEvent
   * @param {(state: string, detail?: object) => void} [o.onState]
   * @param {number} [o.idleMs] reconnect when nothing (not even a keep-alive comment)
   *   arrived for this long; 0 disables
   * @param {number} [o.minDelayMs] first backoff step
   * @param {number} [o.maxDelayMs] backoff cap
   * @param {typeof fetch} [o.fetch]
   */
  constructor(o) {
    this.url = o.url;
    this.onEvent = o.onEvent;
    this.onState = o.onState || (() => {});
    this.idleMs = o.idleMs ?? 0;
    this.minDelayMs = o.minDelayMs ?? 500;
    this.maxDelayMs = o.maxDelayMs ?? 15000;
    this.fetch = o.fetch || globalThis.fetch.bind(globalThis);
    this.parser = new SseParser((ev) => {
      this.attempt = 0; // an event arrived: the connection works, the next drop starts over
      this.onEvent(ev);
    });
    this.state = 'idle';
    this.attempt = 0;
    /** Connections opened so far (the first one included). */
    this.connections = 0;
    this.stopped = false;
    this.controller = null; // aborts the current request
    this.wakeTimer = 0; // the pending reconnect, if any
    this.wake = null;
    this.watchdog = 0;
    this.lastByteAt = 0;
  }

  /** The id the next reconnect resumes after ('' before any id arrived). */
  get lastEventId() {
    return this.parser.lastEventId;
  }

  setState(state, detail) {
    this.state = state;
    this.onState(state, detail);
  }

  /** Starts the connection loop; resolves when the stream is stopped or failed. */
  start() {
    if (this.idleMs > 0) {
      // One timer per stream for its whole life, not one per connection: reconnects add none.
      this.watchdog = setInterval(() => {
        if (this.state === 'open' && performance.now() - this.lastByteAt > this.idleMs) {
          this.drop('no data or keep-alive for ' + Math.round(this.idleMs / 1000) + ' s');
        }
      }, Math.min(this.idleMs, 5000));
    }
    this.done = this.loop();
    return this.done;
  }

  /** Ends the stream for good: aborts the request and cancels any pending reconnect. */
  stop() {
    if (this.stopped) return;
    this.stopped = true;
    clearInterval(this.watchdog);
    clearTimeout(this.wakeTimer);
    if (this.wake) this.wake();
    if (this.controller) this.controller.abort();
  }

  /**
   * Drops the current connection as a network failure would; the loop reconnects with
   * Last-Event-ID. Used by the idle watchdog, and by tests to exercise resuming.
   */
  drop(reason = 'dropped') {
    this.dropReason = reason;
    if (this.controller) this.controller.abort();
  }

  async loop() {
    let refusedWithId = false;
    while (!this.stopped) {
      const controller = new AbortController();
      this.controller = controller;
      this.dropReason = null;
      let reason = 'closed by the server';
      this.setState('connecting');
      try {
        const headers = { Accept: 'text/event-stream' };
        if (this.parser.lastEventId) headers['Last-Event-ID'] = this.parser.lastEventId;
        const res = await this.fetch(this.url, {
          headers,
          signal: controller.signal,
          cache: 'no-store',
        });
        if (!res.ok) {
          const message = await errorMessage(res);
          throw new HttpError(res.status, message);
        }
        const type = res.headers.get('content-type') || '';
        if (!type.startsWith('text/event-stream')) {
          throw new Error(`expected text/event-stream, got ${type || 'no content type'}`);
        }
        if (!res.body) throw new Error('response has no body');
        this.connections++;
        refusedWithId = false;
        this.parser.resetConnection();
        this.lastByteAt = performance.now();
        this.setState('open');
        const reader = res.body.getReader();
        const decoder = new TextDecoder();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          this.lastByteAt = performance.now();
          this.parser.push(decoder.decode(value, { stream: true }));
        }
        this.parser.push(decoder.decode());
      } catch (e) {
        if (this.stopped) break;
        if (e instanceof HttpError && e.status >= 400 && e.status < 500 && e.status !== 408 && e.status !== 429) {
          if (this.parser.lastEventId && !refusedWithId) {
            // The server may not know our resume id (it restarted with new data): start
            // over without it, once, rather than fail a stream that worked.
            refusedWithId = true;
            this.parser.lastEventId = '';
            reason = `resume refused (${e.status}: ${e.message}); starting over`;
            this.onState('resync', { status: e.status, message: e.message });
            continue;
          }
          this.setState('failed', { status: e.status, message: e.message });
          this.stopped = true;
          break;
        }
        reason = this.dropReason || (e instanceof Error ? e.message : String(e));
      } finally {
        this.controller = null;
      }
      if (this.stopped) break;
      this.attempt++;
      const base = this.parser.retryMs ?? this.minDelayMs;
      const delayMs = backoffMs(this.attempt, Math.max(base, 50), Math.max(this.maxDelayMs, base));
      this.setState('reconnecting', { delayMs, reason, attempt: this.attempt });
      await new Promise((resolve) => {
        this.wake = resolve;
        this.wakeTimer = setTimeout(resolve, delayMs);
      });
      this.wake = null;
      this.wakeTimer = 0;
    }
    clearInterval(this.watchdog);
    if (this.state !== 'failed') this.setState('stopped');
  }
}
