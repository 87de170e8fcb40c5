#!/usr/bin/env python3
"""Which pages each commit writes: reads an embedded store's write-ahead log frame by frame and
names the table or index of every page, per commit.

  # run the binary for a while on a fresh store, then kill it so the WAL stays
  TAILRACE_STORE__PATH=/tmp/w/data target/release/tailrace &  sleep 45; kill -9 $!
  python3 scripts/wal_pages.py /tmp/w/data/tailrace.db --last 1000

The WAL is read from its header: the valid frames are those carrying the header's salts (a
reused WAL keeps older frames behind them), and a frame whose "database size" field is set
ends a commit. Page numbers are mapped to B-trees with SQLite's `dbstat` table, on a copy of
the database and its WAL (the store's files are not opened). Pages freed and reused during the
run are counted under their owner at the end, so a short run on a fresh store is the clearest.
Page 1 is listed as `sqlite_schema` (its root); it is also the file's header, written whenever
the file grows.

Uses only the standard library (Debian's and most Pythons' sqlite3 have `dbstat`).
"""

import argparse
import collections
import os
import shutil
import sqlite3
import struct
import sys
import tempfile

WAL_HEADER = 32
FRAME_HEADER = 24


def commits(wal: bytes):
    """The page numbers of each commit in the WAL's valid frames, in order."""
    if len(wal) < WAL_HEADER:
        return [], 0
    magic, _version, page_size, _ckpt, salt1, salt2 = struct.unpack(">IIIIII", wal[:24])
    if magic not in (0x377F0682, 0x377F0683):
        sys.exit("not a SQLite WAL (bad magic number)")
    out, current = [], []
    off = WAL_HEADER
    while off + FRAME_HEADER + page_size <= len(wal):
        page, db_size, s1, s2 = struct.unpack(">IIII", wal[off : off + 16])
        if (s1, s2) != (salt1, salt2):
            break
        current.append(page)
        if db_size:
            out.append(current)
            current = []
        off += FRAME_HEADER + page_size
    return out, page_size


def owners(db: str):
    """Page number -> (B-tree name, page type), from `dbstat` on a copy of db and its WAL."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "copy.db")
        shutil.copyfile(db, copy)
        if os.path.exists(db + "-wal"):
            shutil.copyfile(db + "-wal", copy + "-wal")
        con = sqlite3.connect(copy)
        try:
            rows = con.execute("SELECT name, pageno, pagetype FROM dbstat").fetchall()
        except sqlite3.OperationalError as e:
            sys.exit(f"this Python's SQLite has no dbstat table ({e})")
        finally:
            con.close()
    return {page: (name, kind) for name, page, kind in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", help="the store's database file (its WAL is <db>-wal)")
    ap.add_argument("--last", type=int, default=1000, help="commits counted, newest (default 1000)")
    args = ap.parse_args()
    with open(args.db + "-wal", "rb") as f:
        found, page_size = commits(f.read())
    if not found:
        sys.exit("no committed frames in the WAL (was the store closed cleanly? it checkpoints then)")
    chosen = found[-args.last :]
    pages = owners(args.db)
    per = collections.Counter()
    for commit in chosen:
        for page in commit:
            name, kind = pages.get(page, ("? (freed since)", ""))
            per[(name, kind)] += 1
    frames = sum(map(len, chosen))
    print(f"{len(chosen)} commits of {len(found)} in the WAL; {frames / len(chosen):.2f} pages "
          f"({frames * page_size / len(chosen) / 1024:.1f} KiB) per commit")
    print(f"{'pages per commit':>17}  B-tree (page type)")
    for (name, kind), n in per.most_common():
        print(f"{n / len(chosen):17.2f}  {name} ({kind})" if kind else f"{n / len(chosen):17.2f}  {name}")


if __name__ == "__main__":
    main()
