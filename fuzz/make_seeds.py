#!/usr/bin/env python3
"""Writes the seed corpus of each fuzz target into fuzz/corpus/<target>/ (run from anywhere).

Seeds are small and shaped like the real world: NDJSON with emoji, CJK and right-to-left
text, Wikimedia's and Mastodon's server-sent-event streams, Bluesky Jetstream-like WebSocket
frames, documents with `$`-prefixed and dotted keys, and the TOML of config/. Each binary
target reads a few knob bytes first (fuzz/src/lib.rs): the limit, then the read sizes.
"""
import json
import os
import pathlib
import shutil
import struct

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

# Knobs: limit byte (0..=191: small limits 1..=64; 192..: the large default), reads byte
# (count % 4) followed by that many size bytes.
LARGE = bytes([192])
ONE_READ = bytes([0])


def small(limit):
    return bytes([limit - 1])


def reads(*sizes):
    return bytes([len(sizes)]) + bytes(s - 1 for s in sizes)


def j(doc):
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


TWEET = {
    "id": 1790000000000000001,
    "created_at": "2026-11-30T23:59:59.123Z",
    "text": "Ship it 🚀🦀 #rust #日本語",
    "lang": "en",
    "user": {"id": 42, "screen_name": "ferris_🦀", "followers_count": 1204},
    "entities": {"hashtags": [{"text": "rust"}, {"text": "日本語"}]},
    "retweet_count": 3,
}
ARABIC = {"id": 2, "text": "مرحبا بالعالم ‏#سلام", "lang": "ar", "user": {"screen_name": "سارة"}}
HEBREW = {"id": 3, "text": "שלום עולם 👋🏽", "lang": "he", "count": 7}
CJK = {"id": 4, "text": "東京タワー 🗼 서울 北京", "lang": "ja", "tags": ["東京", "서울"]}
EMOJI = {"id": 5, "text": "👩‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 e\u0301 ẞ", "reactions": {"❤️": 12, "😂": 3}}
DOLLAR = {"$schema": "/mediawiki/recentchange/1.0.0", "meta": {"domain": "en.wikipedia.org"}, "$oid": "x"}
DOTTED = {"user.name": "a.b", "ok": 1}
RECENTCHANGE = {
    "$schema": "/mediawiki/recentchange/1.0.0",
    "meta": {
        "uri": "https://ja.wikipedia.org/wiki/%E6%9D%B1%E4%BA%AC",
        "id": "6c1b2c4e-9a3f-4a55-b1a7-0b7f1d1e2c3d",
        "dt": "2026-11-30T23:59:58Z",
        "stream": "mediawiki.recentchange",
        "topic": "eqiad.mediawiki.recentchange",
        "partition": 0,
        "offset": 5123456789,
    },
    "id": 1876543210,
    "type": "edit",
    "namespace": 0,
    "title": "東京",
    "comment": "/* 歴史 */ typo",
    "timestamp": 1796083198,
    "user": "Example-bot",
    "bot": True,
    "length": {"old": 120345, "new": 120349},
    "wiki": "jawiki",
}
MASTODON = {
    "id": "113555555555555555",
    "created_at": "2026-11-30T23:59:59.000Z",
    "content": "<p>héllo <a href=\"https://example.social/tags/rust\">#rust</a> 🦀</p>",
    "account": {"acct": "ferris@example.social", "display_name": "Ferris 🦀"},
    "language": "en",
    "tags": [{"name": "rust"}],
}
JETSTREAM = {
    "did": "did:plc:eygmaihciaxprqvxpfvl6flk",
    "time_us": 1725911162329308,
    "kind": "commit",
    "commit": {
        "rev": "3l3qo2vutsw2b",
        "operation": "create",
        "collection": "app.bsky.feed.post",
        "rkey": "3l3qo2vuowo2b",
        "record": {"$type": "app.bsky.feed.post", "createdAt": "2026-11-30T23:59:59.000Z",
                   "langs": ["ja"], "text": "おはよう ☀️"},
        "cid": "bafyreidwaivazkwu67xztlmuobx35hs2lnfh3kolmgfmucldvhd3sgzcqi",
    },
}
DOCS = [TWEET, ARABIC, HEBREW, CJK, EMOJI, DOLLAR, DOTTED, RECENTCHANGE, MASTODON]


def nested(depth):
    doc = 1
    for _ in range(depth):
        doc = {"d": doc}
    return j(doc)


def line_framer():
    nd = b"\n".join(j(d) for d in DOCS) + b"\n"
    return {
        "ndjson_mixed_scripts": LARGE + ONE_READ + nd,
        "ndjson_small_reads": LARGE + reads(1, 7, 3) + nd,
        "crlf_and_blank_lines": LARGE + reads(2) + b"\r\n".join(j(d) for d in DOCS[:4]) + b"\r\n\r\n\n  \n",
        "last_line_without_newline": LARGE + ONE_READ + j(TWEET) + b"\n" + j(CJK),
        "truncated_last_line": LARGE + reads(5) + j(TWEET) + b"\n" + j(RECENTCHANGE)[:37],
        "over_the_limit": small(32) + reads(4, 9) + j(RECENTCHANGE) + b"\n" + j({"a": 1}) + b"\n",
        "over_the_limit_crlf": small(8) + ONE_READ + b"12345678\r\n123456789\r\n1234567\r",
        "invalid_utf8": LARGE + ONE_READ + b'{"t":"\xff\xfe"}\n{"t":"\xc3"}\n' + j(HEBREW) + b"\n",
        "dollar_and_dotted_keys": LARGE + reads(3) + j(DOLLAR) + b"\n" + j(DOTTED) + b"\n",
        "split_multibyte": small(64) + reads(1, 2, 3) + "🦀é東\u200f\n".encode() * 4,
    }


def sse():
    wm = b":ok\n\n"
    for i, d in enumerate([RECENTCHANGE, dict(RECENTCHANGE, title="القاهرة", wiki="arwiki")]):
        wm += b"event: message\n"
        wm += b"id: " + j([{"topic": "eqiad.mediawiki.recentchange", "partition": 0, "timestamp": 1796083198000 + i},
                          {"topic": "codfw.mediawiki.recentchange", "partition": 0, "offset": -1}]) + b"\n"
        wm += b"data: " + j(d) + b"\n\n"
    masto = (b":)\n" + b"event: update\ndata: " + j(MASTODON) + b"\n\n"
             + b"event: delete\ndata: 113555555555555555\n\n"
             + b"event: status.update\ndata: " + j(dict(MASTODON, content="<p>编辑了 ✏️</p>")) + b"\n\n"
             + b":thump\n\n")
    return {
        "wikimedia_recentchange": LARGE + ONE_READ + wm,
        "wikimedia_small_reads": LARGE + reads(3, 17, 1) + wm,
        "mastodon_streaming": LARGE + reads(8) + masto,
        "crlf_bom_retry": LARGE + ONE_READ + "\ufeffretry: 2500\r\nid: 1\r\ndata: {\"a\":1}\r\n\r\n".encode(),
        "multiline_data": LARGE + ONE_READ + b"data: {\"text\":\ndata: \"two lines \xf0\x9f\xa6\x80\"}\n\n",
        "empty_and_id_only": LARGE + reads(2) + b"event: ping\n\ndata:\n\nid: 9\n\ndata\n\ndata: {}\n\n",
        "too_large_event": small(24) + ONE_READ + b"data: 0123456789\ndata: 0123456789\ndata: 01\n\ndata: {}\n\n",
        "too_long_line": small(16) + reads(5) + b"data: " + j(TWEET) + b"\n\ndata: {\"ok\":1}\n\n",
        "cut_off_event": LARGE + ONE_READ + b"id: 7\ndata: " + j(CJK)[:20],
        "ids_with_nul_and_utf8": LARGE + ONE_READ + "id: a\0b\ndata: 1\n\nid: 東京-42\ndata: 2\n\n".encode(),
    }


def validate():
    out = {}
    for name, doc in [("tweet", TWEET), ("arabic", ARABIC), ("hebrew", HEBREW), ("cjk", CJK),
                      ("emoji", EMOJI), ("recentchange_dollar_schema", RECENTCHANGE),
                      ("mastodon", MASTODON), ("jetstream_dollar_type", JETSTREAM), ("dotted_key", DOTTED)]:
        out[name] = LARGE + j(doc)
    out.update({
        "not_an_object": LARGE + b'[1,"two",{"three":3}]',
        "number": LARGE + b"113555555555555555",
        "malformed": LARGE + j(TWEET)[:-9],
        "invalid_utf8": LARGE + b'{"t":"caf\xe9"}',
        "lone_surrogate": LARGE + b'{"t":"\\ud83e"}',
        "escapes": LARGE + b'{"t":"\\u00e9\\n\\t\\"\\\\\\/ \\ud83e\\udd80","\\u0024x":1}',
        "nul_in_key": LARGE + b'{"a\\u0000b":1}',
        "deep_100": LARGE + nested(100),
        "deep_101": LARGE + nested(101),
        "big_numbers": LARGE + b'{"u":18446744073709551615,"i":-9223372036854775808,"f":1.7976931348623157e308,"e":1e-320}',
        "too_large": small(4) + j(TWEET),
        "duplicate_keys": LARGE + b'{"a":1,"a":{"$b":2}}',
        "whitespace": LARGE + b' \r\n\t{ "a" : [ ] , "b" : { } }\n ',
        "geo_tweet": LARGE + j({"coordinates": {"type": "Point", "coordinates": [139.69, 35.68]},
                               "place": {"country_code": "JP", "bounding_box": {"type": "Polygon",
                               "coordinates": [[[177.0, -19.0], [-178.0, -19.0], [-178.0, -16.0]]]}},
                               "lang": ["pt-BR"]}),
    })
    return out


def config():
    ref = (ROOT / "config" / "tailrace.toml").read_bytes()
    http = b'''[[sources]]
name = "firehose"
kind = "http"
url = "https://stream.wikimedia.org/v2/stream/recentchange"
format = "sse"
headers = { Authorization = "Bearer ${FIREHOSE_TOKEN}", "X-Api-Key" = "sk-live-abcdef0123456789" }
'''
    ws = b'''[[sources]]
name = "jetstream"
kind = "websocket"
url = "wss://jetstream2.us-east.bsky.network/subscribe?wantedCollections=app.bsky.feed.post"
resume = { field = "time_us", param = "cursor" }
headers = { Authorization = "Bearer tok-0123456789abcdef" }
'''
    return {
        "reference": ref,
        "http_sse_source": http,
        "websocket_source": ws,
        "file_and_command": '''[[sources]]
name = "replay"
kind = "file"
path = "capture.ndjson.gz"
pace = "timestamps"
speed = 10.0

[[sources]]
name = "tool"
kind = "command"
program = "python3"
args = ["producer.py", "--lang=日本語"]
'''.encode(),
        "feeds": b'''[[feeds]]
name = "tail"
kind = "tailable"
collection = "events"

[[feeds]]
name = "changes"
kind = "changes"
''',
        "bad_values": b'[store]\ndurability = "fast"\n[http]\nlisten = "localhost"\n[stats]\nperiod = -3\n',
        "header_secret_wrong_type": b'[[sources]]\nname = "h"\nkind = "http"\nurl = "http://x/"\nheaders = "Bearer sk-live-abcdef0123456789"\n',
        "header_secret_integer": b'[[sources]]\nname = "h"\nkind = "http"\nurl = "http://x/"\nheaders = { "X-Api-Key" = 123456789012 }\n',
        "header_bad_reference": b'[[sources]]\nname = "h"\nkind = "http"\nurl = "http://x/"\nheaders = { Authorization = "Bearer ${sk-live-abcdef0123}" }\n',
        "syntax_error": http[:-20],
        "unknown_key": b'[store]\nengine = "embedded"\nengnie = "mongodb"\n',
    }


def frame(fin, opcode, payload):
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n <= 0xFFFF:
        head += bytes([126]) + struct.pack(">H", n)
    else:
        head += bytes([127]) + struct.pack(">Q", n)
    return head + payload


def websocket_frames():
    post = j(JETSTREAM)
    crab = "🦀".encode()
    return {
        "jetstream_posts": LARGE + ONE_READ + frame(True, 1, post) + frame(True, 1, j(dict(JETSTREAM, time_us=1725911162329309))),
        "jetstream_small_reads": LARGE + reads(3, 1, 16) + frame(True, 1, post) + frame(True, 9, b"") + frame(True, 1, post),
        "ndjson_in_one_frame": LARGE + ONE_READ + frame(True, 1, b"\n".join(j(d) for d in DOCS[:4])),
        "fragmented_split_emoji": LARGE + reads(2) + frame(False, 1, b'{"t":"' + crab[:1]) + frame(True, 9, b"ping")
        + frame(False, 0, crab[1:3]) + frame(True, 0, crab[3:] + b'"}'),
        "binary_and_pong": LARGE + ONE_READ + frame(True, 2, b"\x00\x01\xff") + frame(True, 10, b"pong"),
        "close_with_reason": LARGE + ONE_READ + frame(True, 1, j(CJK)) + frame(True, 8, struct.pack(">H", 1001) + "going away 👋".encode()),
        "extended_length": LARGE + reads(7) + frame(True, 1, j({"text": "ok " * 60})),
        "invalid_utf8": LARGE + ONE_READ + frame(True, 1, b'{"ok":1}') + frame(True, 1, b'{"t":"\xff"}'),
        "too_large_frame": small(32) + reads(5) + frame(True, 1, b'{"a":1}') + frame(True, 1, post),
        "too_large_fragments": small(40) + ONE_READ + frame(False, 1, b"a" * 30) + frame(True, 0, b"b" * 30),
        "too_large_ping": small(8) + ONE_READ + frame(True, 9, b"0123456789"),
        "cut_message": LARGE + reads(4) + frame(True, 1, b'{"ok":1}') + frame(True, 1, j(ARABIC))[:25],
        "masked_from_server": LARGE + ONE_READ + bytes([0x81, 0x82, 1, 2, 3, 4, 0x7A, 0x7B]),
    }


def main():
    for target, seeds in [("line_framer", line_framer()), ("sse", sse()), ("validate", validate()),
                          ("config", config()), ("websocket_frames", websocket_frames())]:
        d = HERE / "corpus" / target
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        for name, data in seeds.items():
            (d / name).write_bytes(data)
        print(f"{target}: {len(seeds)} seeds")


if __name__ == "__main__":
    main()
