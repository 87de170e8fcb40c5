#!/usr/bin/env python3
"""Soak: run the real tailrace binary on the realistic long-tail stream and watch what grows.

The shapes it runs in:

  # a compressed day: 6,000,000 events replayed as fast as the pipeline takes them, rollup
  # retention compressed in proportion (keys idle for 60 s are removed)
  python3 scripts/soak.py --events 6000000 --rate 1000000 --ttl 60 --out soak-day

  # an hour at the sample stream's rate, retention as configured by default (one day)
  python3 scripts/soak.py --seconds 3600 --rate 70 --out soak-hour

  # memory after a burst (issue 10): 150,000 long-tail events from a file as fast as they are
  # taken, beside the 70/s stream, then the 70/s stream alone for five minutes
  python3 scripts/soak.py --seconds 300 --rate 70 --burst 150000 --every 10 --out soak-burst

  # what an event's wait to share a commit trades (latency against CPU and bytes): one
  # soak per value, side by side so that they share the machine's hour
  python3 scripts/soak.py --seconds 660 --rate 70 --every 60 --floor-seconds 0 \
      --batch-max-wait-ms 0 --out soak-wait-0 &

Every --every seconds it samples, from outside the process: resident memory (VmRSS, and its
anonymous part: what the process allocated, without the binary's mapped pages), CPU time,
what the process caused to be written to the disk (`write_bytes` of /proc/<pid>/io) and its
write and sync calls (`syscw`), the data directory's allocated bytes (the journal, the keyed
state's tables), events read and written, each feed's lag, the commits of events and the
end-to-end latency from a source to the tail feed (from /metrics). At the end it
reads a sample of the stored events through the API (`/api/events/{position}`) for their size
as compact JSON, the stream's own bytes, so the summary can say how many times those bytes
were written. It writes samples.csv and summary.md into --out and prints the summary: start,
middle and end, and whether memory and disk levelled off (growth over the second half of the
run against the first).

Then, with tailrace stopped, it measures the floor at the same pace on the same disk
(--floor-seconds): a 4 KiB write into a preallocated file (O_DIRECT, as the journal writes)
and an fdatasync, --rate times a second. A commit paced like the stream pays more than one in
a tight loop (the device and the CPUs idle in between), so the status line's write latency
and the process's CPU are set against this floor, not against `bench writes`' back-to-back one.

Uses only the standard library. Build first: cargo build --release.
"""

import argparse
import csv
import json
import mmap
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(port):
    """The /metrics samples as {(name, frozenset(labels)): value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        pairs = []
        for part in labels.rstrip("}").split('",'):
            if "=" in part:
                k, _, v = part.partition("=")
                pairs.append((k.strip(), v.strip('"')))
        try:
            out[(name, frozenset(pairs))] = float(value)
        except ValueError:
            pass
    return out


def msum(m, name, **want):
    return sum(
        v for (n, labels), v in m.items()
        if n == name and all((k, str(w)) in labels for k, w in want.items())
    )


def rss_bytes(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def write_burst(path, n, seed):
    """`n` tweet-shaped events of the long tail: hashtags over ~2,000,000 values and users over
    5,000,000, both drawn log-uniformly (a few hot, most seen once), text in several scripts."""
    rng = random.Random(seed)
    langs = ["en", "ja", "ar", "es", "pt", "ko", "th", "ru", "und"]
    words = ["東京", "🦀", "مرحبا", "ñandú", "Привет", "สวัสดี", "#", "@", "x" * 40]
    with open(path, "w") as f:
        for i in range(n):
            user = int(5_000_000 ** rng.random())
            tags = [f"tag{int(2_000_000 ** rng.random())}" for _ in range(rng.choice([0, 0, 1, 2, 3]))]
            text = f"burst {i} " + " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
            f.write(json.dumps({
                "id": 2_000_000_000_000_000 + i, "text": text, "lang": rng.choice(langs),
                "user": {"id": user, "screen_name": f"u{user}"}, "hashtags": tags,
                "retweet_count": int(1000 ** rng.random()),
            }) + "\n")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def disk_bytes(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def io_counters(pid):
    """(write_bytes, syscw) of /proc/<pid>/io: bytes the process caused to be sent to the
    storage layer (page-cache pages it dirtied, direct writes), and its write calls."""
    out = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = int(v)
    return out.get("write_bytes", 0), out.get("syscw", 0)


def event_bytes(port, newest, n=200):
    """The mean size, as compact JSON, of up to `n` stored events before position `newest`."""
    sizes = []
    for pos in range(max(1, newest - n + 1), newest + 1):
        try:
            doc = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/events/{pos}", timeout=10))
        except (OSError, ValueError):
            continue
        doc = doc.get("doc", doc)
        sizes.append(len(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()))
    return sum(sizes) / len(sizes) if sizes else None


def paced_floor(directory, rate, seconds):
    """Write + fdatasync paced at `rate` a second for `seconds` in `directory`: latencies (µs,
    sorted), CPU seconds per commit (this thread's user + system time), and whether the writes
    bypassed the page cache (O_DIRECT, where the filesystem allows it)."""
    path = os.path.join(directory, "floor.probe")
    size = 64 << 20
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    direct = True
    try:
        fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    except (OSError, AttributeError):
        direct, fd = False, os.open(path, os.O_RDWR)
    buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(4096))
    n = max(int(rate * seconds), 1)
    lat = []
    try:
        cpu0 = resource.getrusage(resource.RUSAGE_THREAD)
        t0 = time.monotonic()
        for i in range(n):
            t = time.perf_counter()
            try:
                os.pwrite(fd, buf, (i * 4096) % size)
            except OSError:
                if not direct:
                    raise
                # The filesystem refused the direct write after all: fall back to buffered.
                os.close(fd)
                direct, fd = False, os.open(path, os.O_RDWR)
                os.pwrite(fd, buf, (i * 4096) % size)
            os.fdatasync(fd)
            lat.append((time.perf_counter() - t) * 1e6)
            wait = t0 + (i + 1) / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        cpu1 = resource.getrusage(resource.RUSAGE_THREAD)
    finally:
        os.close(fd)
        os.unlink(path)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return sorted(lat), cpu / n, direct


STATUS = re.compile(r"write p50 ([0-9.]+) (ns|µs|ms|s) p99 ([0-9.]+) (ns|µs|ms|s)")
UNIT_US = {"ns": 1e-3, "µs": 1.0, "ms": 1e3, "s": 1e6}


def status_latencies(log_path):
    """The write p50 and p99 of each status line in the log, in µs."""
    out = []
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = STATUS.search(line)
            if m:
                out.append((float(m.group(1)) * UNIT_US[m.group(2)], float(m.group(3)) * UNIT_US[m.group(4)]))
    return out


def pct(sorted_values, q):
    return sorted_values[min(int(len(sorted_values) * q), len(sorted_values) - 1)]


def mib(b):
    return f"{b / 2**20:,.1f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, help="stop after this many events were written")
    ap.add_argument("--seconds", type=float, help="stop after this long")
    ap.add_argument("--rate", type=float, default=70.0, help="synthetic events per second (a large value: flat out)")
    ap.add_argument("--ttl", type=int, help="ingest.rollup_idle_ttl_secs (default: the binary's default)")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--seed", type=int, default=7, help="seed of the synthetic stream")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "tailrace"))
    ap.add_argument("--out", required=True, help="directory for samples.csv and summary.md")
    ap.add_argument("--keep-data", action="store_true", help="keep the data directory")
    ap.add_argument("--floor-seconds", type=float, default=30.0,
                    help="after the run, measure write + fdatasync at --rate for this long on the same disk (0: skip)")
    ap.add_argument("--batch-max-wait-ms", type=int,
                    help="ingest.batch_max_wait_ms (default: the binary's default): how long an event waits to share a commit")
    ap.add_argument("--burst", type=int, default=0,
                    help="also replay this many long-tail events from a file at the start, as fast as they are taken")
    a = ap.parse_args()
    if not a.events and not a.seconds:
        ap.error("give --events, --seconds or both")
    if not os.path.exists(a.binary):
        ap.error(f"{a.binary} not found: run cargo build --release first")
    os.makedirs(a.out, exist_ok=True)

    work = tempfile.mkdtemp(prefix="tailrace-soak-")
    # A copy, so a rebuild during a long soak does not change what runs.
    binary = os.path.join(work, "tailrace")
    shutil.copy2(a.binary, binary)
    data = os.path.join(work, "data")
    port = free_port()
    sources = (
        f'{{name="sample", kind="synthetic", rate_per_sec={a.rate}, seed={a.seed}, '
        f'burst_probability=0.0, vocabulary="realistic"}}'
    )
    if a.burst:
        burst = os.path.join(work, "burst.ndjson")
        write_burst(burst, a.burst, a.seed)
        sources += f', {{name="burst", kind="file", path="{burst}", pace="fast"}}'
    env = dict(os.environ)
    env.update({
        "TAILRACE_HTTP__LISTEN": f"127.0.0.1:{port}",
        "TAILRACE_STORE__PATH": data,
        "TAILRACE_LOG__STATUS_INTERVAL_SECS": "60",
        "TAILRACE_SOURCES": f"[{sources}]",
        "RUST_LOG": env.get("RUST_LOG", "info"),
    })
    if a.ttl is not None:
        env["TAILRACE_INGEST__ROLLUP_IDLE_TTL_SECS"] = str(a.ttl)
    if a.batch_max_wait_ms is not None:
        env["TAILRACE_INGEST__BATCH_MAX_WAIT_MS"] = str(a.batch_max_wait_ms)
    log = open(os.path.join(a.out, "tailrace.log"), "w")
    proc = subprocess.Popen([binary], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    started = time.monotonic()
    try:
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None:
                sys.exit(f"tailrace exited with {proc.returncode}; see {a.out}/tailrace.log")
            if time.monotonic() - started > 60:
                sys.exit("tailrace not ready after 60 s")
            time.sleep(0.2)
        print(f"soak: {binary} on 127.0.0.1:{port}, data in {data}; samples every {a.every:g} s")
        rows = []
        t0 = time.monotonic()
        cpu0 = cpu_seconds(proc.pid)
        io0 = io_counters(proc.pid)
        while True:
            m = metrics(port)
            written, syscw = io_counters(proc.pid)
            row = {
                "seconds": round(time.monotonic() - t0, 1),
                "read": int(msum(m, "tailrace_source_events_total", source="sample")),
                "acked_seq": int(msum(m, "tailrace_source_last_acked_seq", source="sample")),
                "tail_events": int(msum(m, "tailrace_feed_events_total", feed="tail")),
                "changes_events": int(msum(m, "tailrace_feed_events_total", feed="changes")),
                "burst_read": int(msum(m, "tailrace_source_events_total", source="burst")),
                "rss_bytes": rss_bytes(proc.pid),
                "anon_bytes": rss_bytes(proc.pid, "RssAnon"),
                "cpu_seconds": round(cpu_seconds(proc.pid) - cpu0, 2),
                "write_bytes": written - io0[0],
                "write_calls": syscw - io0[1],
                "disk_bytes": disk_bytes(data),
                "journal_bytes": disk_bytes(os.path.join(data, "journal")),
                "keyed_bytes": disk_bytes(os.path.join(data, "keyed")),
                "lag_tail": int(msum(m, "tailrace_feed_lag_events", feed="tail")),
                "lag_changes": int(msum(m, "tailrace_feed_lag_events", feed="changes")),
                "rollups_expired": int(msum(m, "tailrace_rollups_expired_total")),
                "missing": int(msum(m, "tailrace_feed_missing_events_total")),
                "duplicates": int(msum(m, "tailrace_feed_duplicate_events_total")),
                "rejected": int(msum(m, "tailrace_events_rejected_total")),
                # Commits of events (each also carries its rollups, or they follow in their own).
                "commits": int(msum(m, "tailrace_write_latency_seconds_count", collection="events")),
                "e2e_seconds": msum(m, "tailrace_end_to_end_latency_seconds_sum", feed="tail"),
                "e2e_count": int(msum(m, "tailrace_end_to_end_latency_seconds_count", feed="tail")),
                "e2e_within_1ms": int(msum(m, "tailrace_end_to_end_latency_seconds_bucket", feed="tail", le="0.001")),
            }
            rows.append(row)
            print(
                f"  {row['seconds']:>8.0f} s  read {row['read']:>10,} (+{row['burst_read']:,})  "
                f"rss {mib(row['rss_bytes']):>12} (anon {mib(row['anon_bytes'])})  "
                f"disk {mib(row['disk_bytes']):>12}  written {mib(row['write_bytes']):>12}  "
                f"lag {row['lag_tail']}/{row['lag_changes']}",
                flush=True,
            )
            done = (a.events and row["acked_seq"] >= a.events) or (a.seconds and row["seconds"] >= a.seconds)
            if done or proc.poll() is not None:
                break
            time.sleep(a.every)
        # The stream's own bytes: the events as stored, as compact JSON.
        newest = 0
        try:
            status = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/feeds/tail", timeout=10))
            newest = int(status.get("position") or 0)
        except (OSError, ValueError, TypeError):
            pass
        mean_event = event_bytes(port, newest) if newest else None
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()

    floor = None
    if a.floor_seconds > 0 and a.rate <= 10_000:
        floor = paced_floor(work, a.rate, a.floor_seconds)
    minutes = status_latencies(os.path.join(a.out, "tailrace.log"))

    with open(os.path.join(a.out, "samples.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    first, mid, last = rows[0], rows[len(rows) // 2], rows[-1]
    q1 = rows[len(rows) // 4]

    def growth(field):
        """Growth over the second half of the run, as a share of the growth over the first."""
        a1 = (mid[field] or 0) - (first[field] or 0)
        a2 = (last[field] or 0) - (mid[field] or 0)
        return a2, a1

    secs = last["seconds"] or 1
    lines = [
        f"# Soak: {last['read']:,} events in {secs:,.0f} s ({last['read'] / secs:,.0f}/s), "
        f"rate {a.rate:g}/s, rollup TTL {a.ttl if a.ttl is not None else 'default'} s",
        "",
        f"Command: `python3 scripts/soak.py {' '.join(sys.argv[1:])}`; exit code {code}.",
        "",
        "| | start | quarter | middle | end |",
        "|---|---|---|---|---|",
    ]
    for label, field, fmt in [
        ("seconds", "seconds", lambda v: f"{v:,.0f}"),
        ("events read", "read", lambda v: f"{v:,}"),
        ("burst events read", "burst_read", lambda v: f"{v:,}"),
        ("RSS", "rss_bytes", mib),
        ("RSS, anonymous", "anon_bytes", mib),
        ("disk (data directory)", "disk_bytes", mib),
        ("  journal", "journal_bytes", mib),
        ("  keyed state", "keyed_bytes", mib),
        ("written (/proc/<pid>/io write_bytes)", "write_bytes", mib),
        ("write calls (syscw)", "write_calls", lambda v: f"{v:,}"),
        ("CPU seconds", "cpu_seconds", lambda v: f"{v:,.1f}"),
        ("rollup keys expired", "rollups_expired", lambda v: f"{v:,}"),
        ("feed lag tail / changes", None, None),
    ]:
        if field is None:
            cells = [f"{r['lag_tail']:,} / {r['lag_changes']:,}" for r in (first, q1, mid, last)]
        else:
            cells = [fmt(r[field]) for r in (first, q1, mid, last)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    for label, field in [("RSS", "rss_bytes"), ("RSS, anonymous", "anon_bytes"), ("disk", "disk_bytes")]:
        second, first_half = growth(field)
        fmt = mib if field.endswith("bytes") else (lambda v: f"{v:,}")
        # A quantity that a sweep keeps cutting back (rollup keys) oscillates: compare its peaks
        # too, not only the ends.
        halves = rows[: len(rows) // 2 + 1], rows[len(rows) // 2 :]
        peak1, peak2 = (max((r[field] or 0) for r in h) for h in halves)
        if second <= max(first_half, 0) * 0.25:
            verdict = "levelled off"
        elif peak2 <= peak1 * 1.1:
            verdict = "bounded (the second half's peak within 10% of the first's)"
        else:
            verdict = "still growing"
        lines.append(
            f"- {label}: grew {fmt(first_half)} over the first half, {fmt(second)} over the second; "
            f"peak {fmt(peak1)} in the first half, {fmt(peak2)} in the second: {verdict}."
        )
    if a.burst:
        done_at = next((r["seconds"] for r in rows if r["burst_read"] >= a.burst), None)
        after = [r for r in rows if done_at is not None and r["seconds"] >= done_at + 60]
        if after:
            def spread(field):
                v = sorted(r[field] for r in after)
                return f"{mib(v[0])} – {mib(v[-1])} (median {mib(v[len(v) // 2])})"
            lines.append(
                f"- After the burst ({a.burst:,} events read by {done_at:,.0f} s), from a minute later "
                f"to the end ({len(after)} samples): RSS {spread('rss_bytes')}, anonymous {spread('anon_bytes')}."
            )
        else:
            lines.append(f"- The burst ({a.burst:,} events) was not read a minute before the end: no after-burst figure.")
    events = max(last["read"] - first["read"], 1)
    per_event = (last["write_bytes"] - first["write_bytes"]) / events
    calls = (last["write_calls"] - first["write_calls"]) / events
    lines.append(
        f"- Written from the first sample to the last: {per_event:,.0f} bytes and {calls:.2f} write calls per event"
        + (f", {per_event / mean_event:.2f}× the stream's own bytes (its events average {mean_event:,.0f} bytes "
           "as compact JSON, a sample of 200 read back through the API)." if mean_event else
           " (the events' own size could not be read back).")
    )
    commits = (last["commits"] - first["commits"]) / events
    delivered = last["e2e_count"] - first["e2e_count"]
    if delivered > 0:
        e2e_ms = 1e3 * (last["e2e_seconds"] - first["e2e_seconds"]) / delivered
        within = (last["e2e_within_1ms"] - first["e2e_within_1ms"]) / delivered
        lines.append(
            f"- {commits:.3f} commits per event; from a source handing an event over to the tail feed "
            f"holding it: mean {e2e_ms:,.2f} ms, {within * 100:.1f}% within 1 ms."
        )
    cpu_share = last["cpu_seconds"] / secs
    lines.append(
        f"- CPU: {cpu_share * 100:.1f}% of one core on average; "
        f"feeds missing {last['missing']}, duplicates {last['duplicates']}, rejected {last['rejected']}."
    )
    if minutes:
        p50s = sorted(p for p, _ in minutes)
        p99s = [p for _, p in minutes]
        over = sum(1 for p in p99s if p > 5000)
        lines.append(
            f"- Write latency on the status line, {len(minutes)} lines (one a minute): p50 {p50s[0]:,.0f}–{p50s[-1]:,.0f} µs "
            f"(median {pct(p50s, 0.5):,.0f}); p99 up to {max(p99s):,.0f} µs, over 5 ms in {over} of {len(minutes)}."
        )
    if floor:
        lat, cpu_per, direct = floor
        floor_share = cpu_per * a.rate
        lines.append(
            f"- The floor at {a.rate:g} commits/s on the same disk ({a.floor_seconds:g} s, 4 KiB "
            f"{'O_DIRECT ' if direct else ''}write + fdatasync): p50 {pct(lat, 0.5):,.0f} µs, p99 {pct(lat, 0.99):,.0f} µs; "
            f"{cpu_per * 1e6:,.0f} µs of CPU per commit, {floor_share * 100:.2f}% of one core."
        )
        if minutes:
            lines.append(
                f"- Against that floor: write p50 {pct(p50s, 0.5) / pct(lat, 0.5):.2f}× (median minute); "
                f"CPU {cpu_share / floor_share:.1f}× the floor's own."
            )
    summary = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(summary)
    print()
    print(summary)
    if not a.keep_data:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
