#!/usr/bin/env python3
"""Set a soak's per-minute write p99 beside a witness's slow commits on the same disk.

A minute whose status-line p99 is over the target either had tailrace's own work in the way
or the device stalled under every writer alike. `paced_floor.c` with `slow=MS`, run on the
same disk for the soak's length, prints each of its own commits that took longer than MS
with its UTC time; this reads that list and tailrace's log and says, minute by minute,
whether the two saw the slow writes together:

  gcc -O2 -o /tmp/paced_floor scripts/paced_floor.c
  /tmp/paced_floor 20 54000 /var/tmp slow=3 > witness.log &      # 45 minutes
  python3 scripts/soak.py --seconds 2700 --rate 70 --every 60 --floor-seconds 0 --out soak
  python3 scripts/stalls.py soak/tailrace.log witness.log

The witness commits 20 times a second, so a stall shorter than its 50 ms gap can fall
between two of its commits: a minute over the target with no slow witness commit is a
miss the witness did not explain, not proof that the device was quiet.

Uses only the standard library.
"""

import argparse
import datetime
import re

from soak import STATUS, UNIT_US  # the status line's format is read in one place

ANSI = re.compile(r"\x1b\[[0-9;]*m")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z")
SLOW = re.compile(r"slow commit ([0-9.]+) ms")


def when(line):
    m = STAMP.match(line)
    if not m:
        return None
    stamp = m.group(1)
    if "." in stamp:  # Python 3.11 takes at most six digits of a fraction
        head, frac = stamp.split(".")
        stamp = f"{head}.{frac[:6]}"
    return datetime.datetime.fromisoformat(stamp)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", help="tailrace's log (soak.py writes it to --out/tailrace.log)")
    p.add_argument("witness", help="what `paced_floor RATE COUNT DIR slow=MS` printed")
    p.add_argument("--over", type=float, default=5.0, help="the p99 target in ms (default 5)")
    a = p.parse_args()

    minutes = []  # (end of the minute, p50 ms, p99 ms)
    with open(a.log, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = ANSI.sub("", line)
            m = STATUS.search(line)
            t = when(line)
            if m and t:
                minutes.append((t, float(m.group(1)) * UNIT_US[m.group(2)] / 1e3, float(m.group(3)) * UNIT_US[m.group(4)] / 1e3))
    slow = []  # (time, ms)
    with open(a.witness, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = SLOW.search(line)
            t = when(line)
            if m and t:
                slow.append((t, float(m.group(1))))
    if not minutes:
        raise SystemExit(f"{a.log}: no status line with a write p50 and p99 and a UTC time stamp")

    print(f"| minute ending (UTC) | tailrace write p50, p99 | witness commits over {a.over:g} ms (the longest) |")
    print("|---|---|---|")
    missed = explained = stalled = stalled_missed = 0
    start = minutes[0][0] - datetime.timedelta(seconds=60)
    for end, p50, p99 in minutes:
        inside = [ms for t, ms in slow if start < t <= end and ms > a.over]
        start = end
        if p99 > a.over:
            missed += 1
            explained += bool(inside)
        if inside:
            stalled += 1
            stalled_missed += p99 > a.over
        if p99 > a.over or inside:
            longest = f"{len(inside)} ({max(inside):.1f} ms)" if inside else "0"
            print(f"| {end:%H:%M:%S} | {p50:.2f}, {p99:.1f} ms | {longest} |")
    print()
    print(
        f"{len(minutes)} minutes: p99 over {a.over:g} ms in {missed}, of which {explained} with a witness "
        f"commit over {a.over:g} ms in the same minute; the witness saw such a commit in {stalled} "
        f"minutes, of which tailrace's p99 was over in {stalled_missed}."
    )


if __name__ == "__main__":
    main()
