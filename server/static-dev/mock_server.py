#!/usr/bin/env python3
"""A stand-in for tailrace's HTTP API, to develop and check the live page without the binary.

Serves server/static/ as the binary will (`/` -> index.html, `/assets/<path>` -> the file),
and implements the page's three endpoints with generated data:

  GET /api/status
  GET /api/changes?collection=stats&include_initial=true
  GET /api/changes?collection=events&include_initial=true&initial_limit=50&filter=<json>

Events arrive at ~70/s (Poisson) with bursts of ~350/s, with real-world text: every script,
emoji sequences, RTL, up to 280 characters, long hashtags, `$`-prefixed and dotted keys, an
occasional big document, and HTML-looking text the page must show as text. Stats documents
are rewritten once a second per feed and for `ingest`. Streams honour Last-Event-ID (or
resume_after=), answer `gap` when the id is older than the kept history, and an invalid
filter gets `400 {"error": "filter at ...: ..."}` before any event.

Python 3 standard library only. Run:  python3 server/static-dev/mock_server.py --port 9750
It prints `listening on http://HOST:PORT/` on stdout once it accepts connections.
"""

import argparse
import collections
import json
import math
import mimetypes
import os
import random
import re
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATIC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "static"))
VERSION = "0.1.0"


def now_us():
    return time.time_ns() // 1000


# --------------------------------------------------------------------------------------------
# Real-world-looking text


PHRASES = [
    "the stream is live now",
    "what a day for data",
    "just saw the match, unbelievable",
    "東京は今日も雨です",
    "新しいアップデートが来た！",
    "今天的数据流真快",
    "我们在上海见面吧",
    "오늘 날씨 정말 좋다",
    "مرحبا بالعالم، البث مباشر الآن",
    "هذا رائع جدا",
    "שלום עולם, זה עובד",
    "नमस्ते दुनिया, आज का दिन शानदार है",
    "สวัสดีครับ วันนี้อากาศดี",
    "Привет, мир! Поток данных идёт",
    "Γειά σου κόσμε",
    "¡qué partido tan increíble!",
    "que dia incrível para os dados",
    "c'est la fête à Paris ce soir",
    "Zürich → Genève in 2h47",
    "Ελληνικά και English mixed με العربية",
    "👩🏽‍💻 shipping on a Friday 🚀🔥",
    "🇯🇵🇧🇷🇸🇦🏳️‍🌈 flags everywhere",
    "family: 👨‍👩‍👧‍👦 and 🧑🏿‍🤝‍🧑🏻",
    "Z̷a̶l̴g̸o̵ text is still text",
    "math: ∑ x² ≤ ∞ and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "tabs\tand\u00a0non-breaking spaces",
    "RTL inside LTR: the word مرحبا means hello",
    "<b>not bold</b> & <i>not italic</i>",
    "<img src=x onerror=alert(1)> should stay text",
    "</li><script>alert('xss')</script>",
    "${jndi:ldap://example.invalid/a} logs are text too",
]

LANGS = [("en", 40), ("ja", 15), ("es", 8), ("pt", 7), ("ar", 7), ("ko", 4), ("fr", 4),
         ("zh", 4), ("he", 2), ("hi", 2), ("th", 2), ("ru", 2), ("und", 3)]

HASHTAGS = ["rust", "realtime", "東京", "news", "مرحبا", "音楽", "football", "데이터", "ai",
            "🚀", "weather", "données", "travel", "Москва", "tech",
            "averyveryverylonghashtagthatgoesonandonforeverandeverbecausepeopledothat",
            "日本語のとても長いハッシュタグはこういう風に続きます", "science", "art",
            "クリプト", "space", "books", "חדשות", "health"]


def zipf_index(rng, n, power=3.0):
    """An index in [0, n) with a long tail: index 0 is the most frequent, most are rare."""
    return min(n - 1, int(n * rng.random() ** power))


def weighted(rng, items):
    total = sum(w for _, w in items)
    pick = rng.uniform(0, total)
    for item, w in items:
        if pick < w:
            return item
        pick -= w
    return items[0][0]


def screen_name(i):
    # Most names are ASCII like the real synthetic source; some are not.
    if i % 17 == 0:
        return f"محمد_{i}"
    if i % 13 == 0:
        return f"東京ユーザー{i}"
    if i % 11 == 0:
        return f"😀emoji{i}"
    return f"user{i}"


class Generator:
    """Tweet-like documents, stamped as the ingester stamps them."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.next_id = 1_700_000_000_000_000_000 + seed % 1_000_000
        self.seq = 0
        # What GET /api/geo answers: the counts of placed events and the seq they include.
        self.geo = {"precision": {p: 0 for p in ("point", "place", "country", "language", "none")},
                    "country": {"none": 0}, "seq": {}}
        self.geo_lock = threading.Lock()

    def geo_tally(self):
        with self.geo_lock:
            return json.loads(json.dumps(self.geo))

    def event(self):
        rng = self.rng
        self.next_id += rng.randrange(1, 1000)
        self.seq += 1
        user = zipf_index(rng, 50_000) + 1
        tags = [HASHTAGS[zipf_index(rng, len(HASHTAGS), 2.0)] for _ in range(rng.choice([0, 0, 1, 1, 2, 3]))]
        # Text length has a long tail: most are short, some fill all 280 characters.
        target = min(280, int(20 + rng.paretovariate(1.2) * 25))
        words = []
        while sum(len(w) + 1 for w in words) < target:
            words.append(rng.choice(PHRASES))
        text = " ".join(words + [f"#{t}" for t in tags])[:280]
        received = now_us()
        doc = {
            "id": self.next_id,
            "id_str": str(self.next_id),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{received // 1000 % 1000:03d}Z",
            "user": {"id": user, "screen_name": screen_name(user),
                     "followers_count": int(10 ** (1 + 5 * rng.random() ** 4))},
            "lang": weighted(rng, LANGS),
            "text": text,
            "hashtags": tags,
            "retweet_count": int(rng.random() ** 4 * 500),
            "_tailrace": {"source": "sample", "seq": self.seq, "received_us": received,
                          "ingested_us": received + rng.randrange(200, 2000)},
        }
        r = rng.random()
        if r < 0.05:
            doc["coordinates"] = {"type": "Point",
                                  "coordinates": [rng.uniform(-180, 180), rng.uniform(-80, 80)]}
            lon, lat = doc["coordinates"]["coordinates"]
            doc["_tailrace"]["geo"] = {"lon": lon, "lat": lat, "precision": "point", "country": None}
        with self.geo_lock:
            placed = "geo" in doc["_tailrace"]
            self.geo["precision"]["point" if placed else "none"] += 1
            self.geo["country"]["none"] += 1
            self.geo["seq"]["sample"] = self.seq
        if r < 0.10:
            # Keys real documents carry and naive code trips on.
            doc["$meta"] = {"source.region": "eu-west-1", "$score": round(rng.random(), 3)}
            doc["entities.urls"] = [{"display": "example.invalid/ünïcödé"}]
        if r < 0.01:
            doc["extended"] = {"blocks": [{"i": i, "text": rng.choice(PHRASES)} for i in range(400)]}
        return doc


# --------------------------------------------------------------------------------------------
# A MongoDB-style filter, enough for the page: errors name the path like the server does


class FilterError(Exception):
    pass


COMPARE = {"$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$regex",
           "$options", "$size", "$all", "$not", "$elemMatch", "$type"}


def check_filter(f, path="filter"):
    if not isinstance(f, dict):
        raise FilterError(f"{path}: a filter is a JSON object, got {type(f).__name__}")
    for k, v in f.items():
        if k in ("$and", "$or", "$nor"):
            if not isinstance(v, list) or not v:
                raise FilterError(f"{path} at {k}: expected a non-empty array")
            for i, sub in enumerate(v):
                check_filter(sub, f"{path} at {k}[{i}]" if path == "filter" else f"{path}.{k}[{i}]")
        elif k.startswith("$"):
            raise FilterError(f"{path}: unknown top-level operator {k}")
        elif isinstance(v, dict) and any(op.startswith("$") for op in v):
            for op, arg in v.items():
                if op not in COMPARE:
                    where = f"{path} at {k}" if path == "filter" else f"{path}.{k}"
                    raise FilterError(f"{where}: unknown operator {op}")
                if op in ("$in", "$nin", "$all") and not isinstance(arg, list):
                    raise FilterError(f"{path} at {k}.{op}: expected an array")
                if op == "$regex":
                    try:
                        re.compile(arg)
                    except (re.error, TypeError) as e:
                        raise FilterError(f"{path} at {k}.$regex: {e}") from None


def get_path(doc, dotted):
    """Values at a dotted path, descending into arrays like MongoDB."""
    cur = [doc]
    for part in dotted.split("."):
        nxt = []
        for c in cur:
            if isinstance(c, dict) and part in c:
                nxt.append(c[part])
            elif isinstance(c, list):
                for e in c:
                    if isinstance(e, dict) and part in e:
                        nxt.append(e[part])
        cur = nxt
    return cur


def candidates(values):
    out = []
    for v in values:
        out.append(v)
        if isinstance(v, list):
            out.extend(v)
    return out


def cmp_ok(a, b, op):
    try:
        if isinstance(a, bool) or isinstance(b, bool):
            return False
        if isinstance(a, (int, float)) != isinstance(b, (int, float)):
            return False
        return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]
    except TypeError:
        return False


def match_cond(values, cond):
    if not (isinstance(cond, dict) and any(k.startswith("$") for k in cond)):
        return any(c == cond for c in candidates(values))
    for op, arg in cond.items():
        cs = candidates(values)
        if op == "$eq":
            ok = any(c == arg for c in cs)
        elif op == "$ne":
            ok = not any(c == arg for c in cs)
        elif op in ("$gt", "$gte", "$lt", "$lte"):
            ok = any(cmp_ok(c, arg, op) for c in cs)
        elif op == "$in":
            ok = any(c == a for c in cs for a in arg)
        elif op == "$nin":
            ok = not any(c == a for c in cs for a in arg)
        elif op == "$exists":
            ok = bool(values) == bool(arg)
        elif op == "$regex":
            flags = re.I if "i" in cond.get("$options", "") else 0
            ok = any(isinstance(c, str) and re.search(arg, c, flags) for c in cs)
        elif op == "$options":
            ok = True
        elif op == "$size":
            ok = any(isinstance(v, list) and len(v) == arg for v in values)
        elif op == "$all":
            ok = any(isinstance(v, list) and all(a in v for a in arg) for v in values)
        elif op == "$not":
            ok = not match_cond(values, arg)
        elif op == "$elemMatch":
            ok = any(isinstance(v, list) and any(matches(e, arg) if isinstance(e, dict) else match_cond([e], arg)
                                                 for e in v) for v in values)
        elif op == "$type":
            names = {"string": str, "number": (int, float), "array": list, "object": dict, "bool": bool}
            ok = any(isinstance(v, names.get(arg, ())) for v in values)
        else:
            ok = False
        if not ok:
            return False
    return True


def matches(doc, f):
    for k, v in f.items():
        if k == "$and":
            if not all(matches(doc, s) for s in v):
                return False
        elif k == "$or":
            if not any(matches(doc, s) for s in v):
                return False
        elif k == "$nor":
            if any(matches(doc, s) for s in v):
                return False
        elif not match_cond(get_path(doc, k), v):
            return False
    return True


# --------------------------------------------------------------------------------------------
# Collections with a bounded change history


class HistoryLost(Exception):
    def __init__(self, missed):
        super().__init__(missed)
        self.missed = missed


class Collection:
    """A change log (bounded, so old resume ids really expire) plus the current documents."""

    def __init__(self, name, prefix, history, keep_current):
        self.name = name
        self.prefix = prefix  # ids are opaque to the page: a prefix makes sure it treats them so
        self.log = collections.deque(maxlen=history)  # (seq, message)
        self.seq = 0
        self.current = {} if keep_current else None

    def id_of(self, seq):
        return f"{self.prefix}{seq:x}"

    def seq_of(self, ident):
        if not ident.startswith(self.prefix):
            raise ValueError(f"not an id of the {self.name} stream: {ident!r}")
        return int(ident[len(self.prefix):], 16)

    def append(self, op, key, doc):
        self.seq += 1
        msg = {"op": op, "collection": self.name, "key": key, "doc": doc, "committed_at_us": now_us()}
        self.log.append((self.seq, msg))
        if self.current is not None:
            if op == "delete":
                self.current.pop(key, None)
            else:
                self.current[key] = msg
        return self.seq

    def after(self, seq):
        """Messages after seq; HistoryLost when some of them are no longer kept."""
        if not self.log:
            return []
        oldest = self.log[0][0]
        if seq < oldest - 1:
            raise HistoryLost(oldest - 1 - seq)
        # The log is ordered: skip from the right end, as readers are usually near it.
        out = []
        for s, m in reversed(self.log):
            if s <= seq:
                break
            out.append((s, m))
        out.reverse()
        return out

    def initial(self, limit):
        if self.current is not None:
            return list(self.current.values())
        return [m for _, m in list(self.log)[-limit:]] if limit else [m for _, m in self.log]


ODD_EVENTS = [
    # Valid documents that are not tweets, or tweets with fields of another type: the page
    # must show them without throwing.
    lambda rng: {"sensor.id": f"t-{rng.randrange(100)}", "$value": round(rng.uniform(-20, 40), 2), "unit": "°C"},
    lambda rng: {"user": "plain string user", "text": 42, "lang": None, "retweet_count": "many"},
    lambda rng: {"user": ["a", "list"], "text": {"nested": "object"}, "lang": ["en", "ja"]},
    lambda rng: {"text": "👨‍👩‍👧‍👦" * 70, "lang": "und", "user": {"screen_name": "x" * 200}},
    lambda rng: {"text": "", "user": {}, "hashtags": None},
]


def odd_feed_doc(rng, name, kind):
    return rng.choice([
        {"feed": name, "kind": kind, "stats": None, "lag": None, "notify_us": None, "updated_us": now_us()},
        {"feed": name, "kind": kind, "stats": {"events": None, "rate": None, "rate_bands": None,
                                              "top": [{"key": "ok", "count": 3}, {"key": None, "count": 2},
                                                      {"key": {"k": "v"}, "count": 1}, "bad", [], {"no": "key"},
                                                      {"key": "no count"}],
                                              "missing": None, "duplicates": None},
         "lag": "?", "notify_us": {"p50": None, "p99": 0, "count": 0}, "updated_us": now_us()},
        {"feed": name, "kind": kind, "stats": {"rate": -5, "rate_bands": {"upper": None, "lower": "x"}},
         "notify_us": {"p50": -1}, "updated_us": None},
    ])


class World:
    """Everything the mock serves, advanced by two background threads."""

    def __init__(self, rate, seed, burst_probability, late_durability_s, odd=0.0):
        self.odd = odd
        self.lock = threading.Condition()
        self.events = Collection("events", "p", 20_000, keep_current=False)
        self.stats = Collection("stats", "t", 2_000, keep_current=True)
        self.gen = Generator(seed)
        self.rate = rate
        self.burst_probability = burst_probability
        self.late_durability_s = late_durability_s
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.rejected = 0
        self.recent = collections.deque()  # (monotonic, retweets, hashtags) of the last second
        self.rates = collections.deque(maxlen=20)
        self.values = collections.deque(maxlen=200)
        self.top = collections.Counter()
        self.queue_depth = 0

    # events ----------------------------------------------------------------------------------
    def run_events(self):
        rng = random.Random(1)
        burst_until = 0.0
        last_roll = 0.0
        tick = 0.02
        next_t = time.monotonic()
        while not self.stop.is_set():
            t = time.monotonic()
            if t - last_roll >= 1.0:
                last_roll = t
                if t >= burst_until and rng.random() < self.burst_probability:
                    burst_until = t + rng.uniform(1.0, 3.0)
            rate = self.rate * (5.0 if t < burst_until else 1.0)
            n = poisson(rng, rate * tick)
            if n:
                with self.lock:
                    for _ in range(n):
                        doc = self.gen.event()
                        if rng.random() < self.odd:
                            doc = dict(rng.choice(ODD_EVENTS)(rng), _tailrace=doc["_tailrace"])
                        key = str(self.events.seq + 1)
                        self.events.append("insert", key, doc)
                        rt = doc.get("retweet_count")
                        self.recent.append((t, rt if isinstance(rt, int) else 0, doc.get("hashtags") or []))
                        for h in doc.get("hashtags") or []:
                            self.top[h] += 1
                        if rng.random() < 0.001:
                            self.rejected += 1
                    self.queue_depth = max(0, n - 8)
                    self.lock.notify_all()
            next_t += tick
            self.stop.wait(max(0.0, next_t - time.monotonic()))

    # stats -----------------------------------------------------------------------------------
    def run_stats(self):
        rng = random.Random(2)
        events_total = 0
        next_t = time.monotonic() + 1.0
        while not self.stop.wait(max(0.0, next_t - time.monotonic())):
            next_t += 1.0
            t = time.monotonic()
            with self.lock:
                while self.recent and self.recent[0][0] < t - 1.0:
                    self.recent.popleft()
                rate = len(self.recent)
                events_total = self.events.seq
                self.rates.append(rate)
                self.values.extend(r for _, r, _ in self.recent)
                # Decay so the top list follows what is popular now.
                for k in list(self.top):
                    self.top[k] *= 0.98
                    if self.top[k] < 0.5:
                        del self.top[k]
                top = [{"key": k, "count": int(round(v))} for k, v in self.top.most_common(10)]
                rate_bands = bands(self.rates) if len(self.rates) >= 5 else None
                value_bands = bands(self.values) if len(self.values) >= 20 else None
                for name, kind, lag_p in (("tail", "tailable", 0.05), ("changes", "changes", 0.2)):
                    notify = None
                    if events_total > 0:
                        p50 = int(rng.lognormvariate(math.log(72), 0.15))
                        notify = {"p50": p50, "p99": int(p50 * rng.uniform(2.0, 3.5)), "count": rate}
                    doc = {
                        "feed": name, "kind": kind,
                        "stats": {"events": events_total, "rate": rate, "rate_bands": rate_bands,
                                  "value_bands": value_bands, "top": top, "missing": 0,
                                  "duplicates": 1 if name == "changes" and events_total > 5000 else 0},
                        "lag": rng.randrange(0, 40) if rng.random() < lag_p else 0,
                        "notify_us": notify,
                        "updated_us": now_us(),
                    }
                    if rng.random() < self.odd * 5:
                        doc = odd_feed_doc(rng, name, kind)
                    self.stats.append("replace", name, doc)
                if rng.random() < self.odd * 5:
                    # A key that comes and goes, with `$` and dots in it.
                    ghost = "$ghost.feed"
                    if ghost in self.stats.current:
                        self.stats.append("delete", ghost, None)
                    else:
                        self.stats.append("insert", ghost, {"feed": ghost, "kind": "changes", "stats": {}, "updated_us": now_us()})
                write_us = {"journaled": latency(rng, 710)}
                if time.monotonic() - self.started >= self.late_durability_s:
                    # A second durability level appears later, as when a source with another
                    # level starts: the page has to grow its chart.
                    write_us["acknowledged"] = latency(rng, 90)
                self.stats.append("replace", "ingest", {
                    "rate": float(rate), "written": events_total, "rejected": self.rejected,
                    "queue_depth": self.queue_depth, "write_us": write_us, "updated_us": now_us(),
                })
                self.lock.notify_all()


def poisson(rng, lam):
    # Knuth's method is fine for the small means of one 20 ms tick.
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def bands(xs):
    n = len(xs)
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / n)
    return {"upper": round(mean + 2 * sd, 2), "middle": round(mean, 2), "lower": round(mean - 2 * sd, 2),
            "stddev": round(sd, 2)}


def latency(rng, typical):
    p50 = int(rng.lognormvariate(math.log(typical), 0.1))
    return {"p50": p50, "p99": int(p50 * rng.uniform(1.6, 2.6)), "count": 70}


# --------------------------------------------------------------------------------------------
# HTTP


class Handler(BaseHTTPRequestHandler):
    server_version = "tailrace-mock/" + VERSION
    world = None  # set in main
    quiet = True
    keepalive_s = 15.0

    def log_message(self, fmt, *args):
        if not self.quiet:
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    def send_json(self, status, body):
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        q = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        try:
            if url.path in ("/", "/index.html"):
                return self.send_file("index.html")
            if url.path.startswith("/assets/"):
                return self.send_file(urllib.parse.unquote(url.path[len("/assets/"):]))
            if url.path == "/api/status":
                return self.send_json(200, self.status())
            if url.path == "/api/geo":
                return self.send_json(200, self.world.gen.geo_tally())
            if url.path == "/api/changes":
                return self.changes(q)
            if url.path == "/favicon.ico":
                return self.send_json(404, {"error": "no favicon"})
            return self.send_json(404, {"error": f"no route {url.path}"})
        except (BrokenPipeError, ConnectionResetError):
            return None

    def send_file(self, rel):
        path = os.path.normpath(os.path.join(STATIC, rel))
        if not path.startswith(STATIC + os.sep) or not os.path.isfile(path):
            return self.send_json(404, {"error": f"no asset {rel}"})
        with open(path, "rb") as f:
            data = f.read()
        ctype = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                 ".html": "text/html; charset=utf-8"}.get(os.path.splitext(path)[1]) \
            or mimetypes.guess_type(path)[0] or "application/octet-stream"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(data)

    def status(self):
        w = self.world
        host, port = self.server.server_address[:2]
        return {
            "info": {"version": VERSION, "engine": "embedded", "durability": "journaled",
                     "data": "/home/operator/tailrace/data", "sources": [{"name": "sample", "kind": "synthetic"}],
                     "feeds": [{"name": "tail", "kind": "tailable"}, {"name": "changes", "kind": "changes"}],
                     "listen": f"{host}:{port}"},
            "ready": True,
            "ingest": {"written": w.events.seq, "rejected": w.rejected, "queue_depth": w.queue_depth},
        }

    def changes(self, q):
        w = self.world
        name = q.get("collection", [""])[0]
        coll = {"events": w.events, "stats": w.stats}.get(name)
        if coll is None:
            return self.send_json(400, {"error": f"collection: unknown collection {name!r}; known: events, stats"})
        include_initial = q.get("include_initial", ["false"])[0] == "true"
        try:
            limit = int(q.get("initial_limit", ["0"])[0] or 0)
        except ValueError:
            return self.send_json(400, {"error": "initial_limit: not a number"})
        flt = None
        raw = q.get("filter", [""])[0]
        if raw.strip():
            try:
                flt = json.loads(raw)
            except json.JSONDecodeError as e:
                return self.send_json(400, {"error": f"filter: not JSON: {e}"})
            try:
                check_filter(flt)
            except FilterError as e:
                return self.send_json(400, {"error": str(e)})
        resume = self.headers.get("Last-Event-ID") or q.get("resume_after", [""])[0]
        cursor = None
        if resume:
            try:
                cursor = coll.seq_of(resume)
            except ValueError as e:
                return self.send_json(400, {"error": f"resume_after: {e}"})
            if cursor > coll.seq:
                # An id this server never gave out: the client saw another history (the server
                # restarted without its data). Waiting for the numbers to catch up would show
                # nothing for minutes; refusing makes the client start over.
                return self.send_json(400, {"error": f"resume_after: {resume!r} is ahead of this stream"})

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Accel-Buffering", "no")
        self.end_headers()

        def send(kind, data, ident=None):
            head = f"id: {ident}\n" if ident is not None else ""
            self.wfile.write(f"{head}event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode())

        def send_initial():
            with w.lock:
                snapshot = coll.seq
                docs = [m for m in coll.initial(limit) if flt is None or matches(m["doc"], flt)]
            send("state", {"state": "initializing"}, coll.id_of(snapshot))
            for m in docs:
                send("initial", m, coll.id_of(snapshot))
            send("state", {"state": "ready"}, coll.id_of(snapshot))
            self.wfile.flush()
            return snapshot

        if cursor is None:
            cursor = send_initial() if include_initial else coll.seq
        last_write = time.monotonic()
        while not w.stop.is_set():
            with w.lock:
                try:
                    batch = coll.after(cursor)
                except HistoryLost as e:
                    batch = None
                    missed = e.missed
                if batch == []:
                    w.lock.wait(1.0)
                    try:
                        batch = coll.after(cursor)
                    except HistoryLost as e:
                        batch = None
                        missed = e.missed
            if batch is None:
                # The id is older than the kept history: say so, then start over from the
                # current documents, as a client would have to anyway.
                send("gap", {"reason": "history_lost", "missed": missed, "resume": "initial"})
                cursor = send_initial()
                continue
            for seq, m in batch:
                cursor = seq
                if flt is None or (m["doc"] is not None and matches(m["doc"], flt)):
                    send("change", m, coll.id_of(seq))
                    last_write = time.monotonic()
            if w.odd and batch and random.random() < w.odd * 5:
                # Event types and fields the page does not know must be ignored, not fatal.
                self.wfile.write(b'event: lagged\ndata: {"missed": 3}\n\n: a comment\nretry: 1000\nfoo: bar\n\n')
            if time.monotonic() - last_write >= self.keepalive_s:
                # Like axum's KeepAlive: a comment, so idle filtered streams stay provably alive.
                self.wfile.write(b": keep-alive\n\n")
                last_write = time.monotonic()
            self.wfile.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9750, help="0 picks a free port")
    ap.add_argument("--rate", type=float, default=70.0, help="mean events per second outside bursts")
    ap.add_argument("--burst-probability", type=float, default=0.03, help="chance per second of a 5x burst")
    ap.add_argument("--late-durability-s", type=float, default=5.0,
                    help="seconds before a second durability level appears in the ingest document")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--odd", type=float, default=0.0,
                    help="share of odd but valid documents (non-tweets, nulls, wrong types) and "
                         "unknown event types, to check the page copes; e.g. 0.05")
    ap.add_argument("--verbose", action="store_true", help="log every request to stderr")
    a = ap.parse_args()

    world = World(a.rate, a.seed, a.burst_probability, a.late_durability_s, a.odd)
    Handler.world = world
    Handler.quiet = not a.verbose
    server = ThreadingHTTPServer((a.host, a.port), Handler)
    server.daemon_threads = True
    for target in (world.run_events, world.run_stats):
        threading.Thread(target=target, daemon=True).start()
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}/", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        world.stop.set()
        with world.lock:
            world.lock.notify_all()
        server.server_close()


if __name__ == "__main__":
    main()
