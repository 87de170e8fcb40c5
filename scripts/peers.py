#!/usr/bin/env python3
"""The durable peers, measured as `tailrace bench` measures tailrace: Redis with
`appendfsync always` and PostgreSQL with `synchronous_commit = on`, from Debian's packages,
each started on loopback in a directory of its own on the disk given (--dir), then stopped.

  apt-get install redis-server postgresql python3-psycopg2
  cargo build --release
  /usr/bin/python3 scripts/peers.py --dir /var/tmp/peers --out peers-results

For each peer, on the same events (tailrace's realistic stream, taken from the release binary
through its API, or --events FILE of NDJSON):
  - single durable append: one event per request, each acknowledged only once durable (Redis:
    XADD, answered after the AOF's fsync; PostgreSQL: one INSERT per transaction); latency of
    each, p50 and p99;
  - batched: Redis pipelines of --batch XADDs (the AOF is fsynced once per event-loop pass, so
    a pipeline shares its fsync); PostgreSQL --batch rows per transaction; events per second;
  - bytes the server caused to be written per event (write_bytes of /proc/<pid>/io, the same
    counter soak.py reads for tailrace), single and batched.
Beside them, in the same sitting, the floor: a 512-byte append + fdatasync on the same disk,
as `tailrace bench writes` measures it. Medians of --rounds alternating rounds.

Writes <out>/peers.json and prints a table. PostgreSQL runs as the `postgres` user (it
refuses root); its directory is made for that user.
"""

import argparse
import json
import os
import pwd
import shutil
import socket
import statistics
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


def write_bytes(pid):
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def tree_write_bytes(pid):
    """write_bytes of a process and its children (PostgreSQL writes from several processes)."""
    total = 0
    pids = [pid]
    while pids:
        p = pids.pop()
        try:
            total += write_bytes(p)
            with open(f"/proc/{p}/task/{p}/children") as f:
                pids.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def pct(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def fdatasync_floor(d, n):
    path = os.path.join(d, "fdatasync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    block = b"x" * 512
    times = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            times.append((time.perf_counter() - t) * 1e6)
    finally:
        os.close(fd)
        os.unlink(path)
    return times


def realistic_events(binary, n):
    """`n` events of tailrace's realistic stream, as the release binary stores them."""
    work = tempfile.mkdtemp(prefix="peers-events-")
    port = free_port()
    env = dict(os.environ)
    env.update({
        "TAILRACE_HTTP__LISTEN": f"127.0.0.1:{port}",
        "TAILRACE_STORE__PATH": os.path.join(work, "data"),
        "TAILRACE_STORE__EVENTS__MAX_DOCS": str(1 << 40),
        "TAILRACE_STORE__EVENTS__MAX_BYTES": str(1 << 34),
        "TAILRACE_STORE__DURABILITY": "acknowledged",
        "TAILRACE_SOURCES": '[{name="sample", kind="synthetic", rate_per_sec=5000.0, seed=11, '
                            'burst_probability=0.0, vocabulary="realistic"}]',
    })
    proc = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work)
    try:
        while True:
            try:
                st = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/feeds/tail", timeout=2))
                if int(st.get("position") or 0) >= n:
                    break
            except (OSError, ValueError):
                pass
            if proc.poll() is not None:
                sys.exit("tailrace exited while making events")
            time.sleep(0.5)
        out = []
        for pos in range(1, n + 1):
            r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/events/{pos}", timeout=10))
            out.append(json.dumps(r["doc"], ensure_ascii=False, separators=(",", ":")))
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


class Redis:
    def __init__(self, d):
        self.dir = os.path.join(d, "redis")
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
             "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                self.sock = socket.create_connection(("127.0.0.1", self.port))
                break
            except OSError:
                time.sleep(0.1)
        self.buf = b""
        assert self.call(b"PING") == b"+PONG"

    def pid(self):
        return self.proc.pid

    def _line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(1 << 16)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _reply(self):
        line = self._line()
        if line[:1] == b"$":
            n = int(line[1:])
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(1 << 16)
            v, self.buf = self.buf[:n], self.buf[n + 2:]
            return v
        if line[:1] == b"-":
            raise RuntimeError(line.decode())
        return line

    @staticmethod
    def encode(*args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def call(self, *args):
        self.sock.sendall(self.encode(*args))
        return self._reply()

    def single(self, event):
        self.call(b"XADD", b"events", b"*", b"e", event.encode())

    def batch(self, events):
        self.sock.sendall(b"".join(self.encode(b"XADD", b"events", b"*", b"e", e.encode()) for e in events))
        for _ in events:
            self._reply()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


class Postgres:
    def __init__(self, d):
        import psycopg2  # Debian's python3-psycopg2
        self.dir = os.path.join(d, "postgres")
        os.makedirs(self.dir, exist_ok=True)
        pg = pwd.getpwnam("postgres")
        os.chown(self.dir, pg.pw_uid, pg.pw_gid)
        bindir = sorted(p for p in os.listdir("/usr/lib/postgresql"))[-1]
        bindir = f"/usr/lib/postgresql/{bindir}/bin"
        data = os.path.join(self.dir, "data")
        self.port = free_port()
        as_pg = ["runuser", "-u", "postgres", "--"]
        subprocess.run(as_pg + [f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.proc = subprocess.Popen(
            as_pg + [f"{bindir}/postgres", "-D", data, "-k", self.dir, "-p", str(self.port),
                     "-c", "listen_addresses=127.0.0.1", "-c", "synchronous_commit=on", "-c", "fsync=on"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                self.conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
                break
            except psycopg2.OperationalError:
                time.sleep(0.1)
        self.conn.autocommit = True
        with self.conn.cursor() as c:
            c.execute("CREATE TABLE events (pos bigserial PRIMARY KEY, body jsonb NOT NULL)")
            c.execute("SHOW synchronous_commit")
            assert c.fetchone()[0] == "on"

    def pid(self):
        # The postmaster, whose children (backends, WAL writer, checkpointer) write.
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        return int(out[0]) if out else self.proc.pid

    def single(self, event):
        with self.conn.cursor() as c:
            c.execute("INSERT INTO events (body) VALUES (%s)", (event,))

    def batch(self, events):
        self.conn.autocommit = False
        with self.conn.cursor() as c:
            from psycopg2.extras import execute_values
            execute_values(c, "INSERT INTO events (body) VALUES %s", [(e,) for e in events], page_size=len(events))
        self.conn.commit()
        self.conn.autocommit = True

    def stop(self):
        self.conn.close()
        self.proc.terminate()
        self.proc.wait(timeout=60)


def measure(peer, events, single_n, batched_n, batch):
    pid = peer.pid()
    # Warm-up: the server's first files (PostgreSQL's first WAL segment, Redis's AOF) and
    # caches, as tailrace's bench warms up before it measures.
    for e in events[:200]:
        peer.single(e)
    peer.batch(events[:batch])
    w0 = tree_write_bytes(pid)
    times = []
    for e in events[:single_n]:
        t = time.perf_counter()
        peer.single(e)
        times.append((time.perf_counter() - t) * 1e6)
    w1 = tree_write_bytes(pid)
    t = time.perf_counter()
    i = 0
    while i < batched_n:
        chunk = [events[(i + k) % len(events)] for k in range(min(batch, batched_n - i))]
        peer.batch(chunk)
        i += len(chunk)
    secs = time.perf_counter() - t
    w2 = tree_write_bytes(pid)
    return {
        "single_p50_us": pct(times, 0.5),
        "single_p99_us": pct(times, 0.99),
        "single_bytes_per_event": (w1 - w0) / single_n,
        "batched_events_per_sec": batched_n / secs,
        "batched_bytes_per_event": (w2 - w1) / batched_n,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="where the peers keep their data: the disk tailrace is measured on")
    ap.add_argument("--out", required=True)
    ap.add_argument("--events", help="NDJSON file of events (default: take them from the release binary)")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "tailrace"))
    ap.add_argument("--single", type=int, default=1000, help="single durable appends per round")
    ap.add_argument("--batched", type=int, default=100_000, help="events per batched run")
    ap.add_argument("--batch", type=int, default=1000, help="events per pipeline / transaction")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are reported")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.dir, exist_ok=True)
    if a.events:
        with open(a.events) as f:
            events = [line.strip() for line in f if line.strip()]
    else:
        cache = os.path.join(a.out, "events.ndjson")
        if os.path.exists(cache):
            with open(cache) as f:
                events = [line.strip() for line in f if line.strip()]
        else:
            print("taking 20,000 realistic events from the release binary ...", flush=True)
            events = realistic_events(a.binary, 20_000)
            with open(cache, "w") as f:
                f.write("\n".join(events) + "\n")
    mean = statistics.mean(len(e.encode()) for e in events)
    print(f"{len(events):,} events, {mean:.0f} bytes each on average (compact JSON)")

    rounds = []
    for r in range(a.rounds):
        work = tempfile.mkdtemp(prefix=f"peers-{r}-", dir=a.dir)
        os.chmod(work, 0o755)
        row = {"floor_fdatasync_512b_p50_us": pct(fdatasync_floor(work, a.single), 0.5)}
        for name, make in [("redis", Redis), ("postgres", Postgres)] if r % 2 == 0 else [("postgres", Postgres), ("redis", Redis)]:
            peer = make(work)
            try:
                row[name] = measure(peer, events, a.single, a.batched, a.batch)
            finally:
                peer.stop()
        rounds.append(row)
        shutil.rmtree(work, ignore_errors=True)
        print(f"round {r + 1}: {json.dumps(row)}", flush=True)

    def med(f):
        return statistics.median(f(x) for x in rounds)

    summary = {
        "event_bytes": mean,
        "rounds": rounds,
        "floor_fdatasync_512b_p50_us": med(lambda x: x["floor_fdatasync_512b_p50_us"]),
    }
    for name in ["redis", "postgres"]:
        summary[name] = {k: med(lambda x, k=k: x[name][k]) for k in rounds[0][name]}
    with open(os.path.join(a.out, "peers.json"), "w") as f:
        json.dump(summary, f, indent=2)
    floor = summary["floor_fdatasync_512b_p50_us"]
    print()
    print(f"medians of {a.rounds} rounds; fdatasync floor (512-byte append) p50 {floor:.0f} µs")
    print(f"{'peer':<40} {'single p50':>11} {'×floor':>7} {'p99':>9} {'B/event single':>15} {'batched ev/s':>13} {'B/event batched':>16}")
    for name, label in [("redis", "Redis, appendfsync always"), ("postgres", "PostgreSQL, synchronous_commit=on")]:
        s = summary[name]
        print(f"{label:<40} {s['single_p50_us']:>9.0f}µs {s['single_p50_us'] / floor:>6.2f}× {s['single_p99_us']:>7.0f}µs "
              f"{s['single_bytes_per_event']:>15,.0f} {s['batched_events_per_sec']:>13,.0f} {s['batched_bytes_per_event']:>16,.0f}")


if __name__ == "__main__":
    main()
