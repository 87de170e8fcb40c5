#!/usr/bin/env python3
"""Write tailrace/symbol-order.txt: the functions a running pipeline executes, hottest first.

The release build links its functions in this order (tailrace/build.rs), so the code a
pipeline runs sits together at the start of the binary's text instead of spread over all of
it. The kernel maps a binary's code into a process in blocks around each page touched (fault-
around, whole large folios), so scattered code makes most of the text resident: that is
resident memory the process holds for the binary's whole life (tailrace/build.rs; figures in
docs/BENCHMARKS.md, "The release build").

How: run a release build under valgrind's callgrind (Debian's `valgrind`) as `cargo run
--release` runs it, on the realistic synthetic stream at 70 events/s, for --seconds; meanwhile
read what operators and the live page read (/metrics, /api/status, the feeds, a change feed
client, an event). Every function of the binary that executed is listed, by the instructions
it executed itself, most first.

    cargo build --release -p tailrace
    python3 scripts/symbol_order.py --binary target/release/tailrace
    cargo build --release -p tailrace      # links in the new order

Symbol names change as the code does: a function renamed or changed since the list was
written is left where the linker puts it. Nothing breaks; the binary only holds more of its
code resident. Their hashes also change with the crates' dependencies and the compiler, which
renames nearly every function at once: beside the list this writes tailrace/symbol-order.stamp
(the rustc release and a hash of Cargo.lock it was taken with), and a release build with
others warns (tailrace/build.rs). Run this again then, after large changes, or a new Rust.
"""

import argparse
import collections
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()
    except OSError:
        return None


def follow_changes(base, seconds):
    """A change feed client, as the live page keeps one open (read for `seconds`)."""
    try:
        with urllib.request.urlopen(f"{base}/api/changes?collection=events", timeout=seconds) as r:
            end = time.monotonic() + seconds
            while time.monotonic() < end and r.readline():
                pass
    except OSError:
        pass


def self_costs(path, binary_name):
    """Instructions executed per function of the binary, from a callgrind output file."""
    names, objects = {}, {}
    obj = fn = None
    after_call = False
    cost = collections.Counter()
    owner = {}
    spec = re.compile(r"^(ob|cob|fl|fi|fe|cfi|cfl|fn|cfn)=\((\d+)\)(?: (.*))?$")
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = spec.match(line)
            if m:
                kind, ident, name = m.groups()
                if kind in ("ob", "cob"):
                    if name is not None:
                        objects[ident] = name
                    if kind == "ob":
                        obj = objects[ident]
                elif kind in ("fn", "cfn"):
                    if name is not None:
                        names[ident] = name
                    if kind == "fn":
                        fn = names[ident]
                        owner[fn] = obj
                        cost[fn] += 0
                continue
            if line.startswith("calls="):
                # The next cost line is the call's inclusive cost, not the caller's own.
                after_call = True
                continue
            if fn and line and (line[0].isdigit() or line[0] in "+-*"):
                if after_call:
                    after_call = False
                    continue
                try:
                    cost[fn] += int(line.split()[-1])
                except ValueError:
                    pass
    own = collections.Counter()
    for name, n in cost.items():
        if not (owner.get(name) or "").endswith("/" + binary_name):
            continue
        # callgrind marks recursion levels ("f'2"); addresses have no symbol to order.
        name = re.sub(r"'\d+$", "", name)
        if name.startswith("0x") or name.startswith("("):
            continue
        own[name] += n
    return own


def fnv1a64(data):
    """FNV-1a, 64 bits, as tailrace/build.rs computes it."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def write_stamp(order_path):
    """What the list was taken with, for tailrace/build.rs to compare with its build."""
    rustc = os.environ.get("RUSTC", "rustc")
    info = subprocess.run([rustc, "-vV"], capture_output=True, text=True, check=True).stdout
    release = next(l.split(": ", 1)[1] for l in info.splitlines() if l.startswith("release: "))
    with open(os.path.join(ROOT, "Cargo.lock"), "rb") as f:
        lock = fnv1a64(f.read())
    stamp = os.path.splitext(order_path)[0] + ".stamp"
    with open(stamp, "w") as f:
        f.write("# What symbol-order.txt was taken with (scripts/symbol_order.py); a release\n"
                "# build with another rustc or Cargo.lock warns that the list may be stale.\n"
                f"rustc {release}\n"
                f"Cargo.lock fnv1a64 {lock:016x}\n")
    return stamp


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "tailrace"))
    ap.add_argument("--seconds", type=float, default=420)
    ap.add_argument("--out", default=os.path.join(ROOT, "tailrace", "symbol-order.txt"))
    a = ap.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("valgrind not found: apt-get install valgrind")
    if not os.path.exists(a.binary):
        sys.exit(f"{a.binary} not found: cargo build --release -p tailrace first")

    work = tempfile.mkdtemp(prefix="tailrace-order-")
    binary = os.path.join(work, "tailrace")
    shutil.copy2(a.binary, binary)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    env.update({
        "TAILRACE_HTTP__LISTEN": f"127.0.0.1:{port}",
        "TAILRACE_STORE__PATH": os.path.join(work, "data"),
        "TAILRACE_LOG__STATUS_INTERVAL_SECS": "20",
        "TAILRACE_SOURCES": '[{name="sample", kind="synthetic", rate_per_sec=70, seed=1, '
                            'burst_probability=0.0, vocabulary="realistic"}]',
        # Small bounds, so that the minutes sampled run what a long run reaches only after
        # hours at the defaults: capped eviction, the op log's trimming, the release of old
        # journal segments and the expiry of idle rollups. Their code is then placed with
        # the rest instead of holding a block of text resident each once they first run.
        "TAILRACE_STORE__EVENTS__MAX_DOCS": "2000",
        "TAILRACE_STORE__OPLOG_MAX_ENTRIES": "1000",
        "TAILRACE_INGEST__ROLLUP_IDLE_TTL_SECS": "60",
    })
    out_file = os.path.join(work, "callgrind.out")
    log = open(os.path.join(work, "tailrace.log"), "w")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--demangle=no", f"--callgrind-out-file={out_file}", binary],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work,
    )
    try:
        started = time.monotonic()
        while get(f"{base}/readyz", timeout=2) is None:
            if proc.poll() is not None:
                sys.exit(f"tailrace exited with {proc.returncode}; see {work}/tailrace.log")
            if time.monotonic() - started > 120:
                sys.exit("tailrace not ready after 120 s under valgrind")
            time.sleep(0.5)
        print(f"symbol_order: tailrace under callgrind on {base} for {a.seconds:g} s", flush=True)
        client = threading.Thread(target=follow_changes, args=(base, a.seconds), daemon=True)
        client.start()
        end = started + a.seconds
        while time.monotonic() < end:
            for path in ("/metrics", "/api/status", "/api/feeds", "/api/feeds/tail", "/",
                         "/api/events/latest", "/api/events/1", "/api/rollups"):
                get(base + path)
            time.sleep(15)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if not os.path.exists(out_file):
        sys.exit(f"callgrind wrote no profile; see {work}/tailrace.log")
    own = self_costs(out_file, "tailrace")
    order = [name for name, _ in own.most_common()]
    with open(a.out, "w") as f:
        f.write("".join(name + "\n" for name in order))
    stamp = write_stamp(a.out)
    print(f"symbol_order: {len(order)} functions executed, {sum(own.values()):,} instructions; wrote {a.out} and {stamp}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
