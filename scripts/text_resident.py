#!/usr/bin/env python3
"""How much of a running tailrace's code is resident, inside and outside the ordered functions.

The release build links the functions of tailrace/symbol-order.txt first (tailrace/build.rs),
so the code a pipeline runs sits in few pages. A function missing from the list (renamed since,
or only run by paths the list's sample never reached) costs a block of text resident once it
runs: the kernel maps the page cache's large folios whole. This reads the process's
/proc/<pid>/pagemap over its text mapping (root, or the process's owner with CAP_SYS_ADMIN,
sees the present bit) and places each resident page against the binary's symbol table (`nm`).

    python3 scripts/text_resident.py PID [--order tailrace/symbol-order.txt]

When most resident pages lie outside the ordered region, take the list again
(scripts/symbol_order.py).
"""

import argparse
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = 4096
BLOCK = 128 * 1024


def mappings(pid):
    """The binary's path, its load base and its executable mapping's range."""
    exe = os.readlink(f"/proc/{pid}/exe")
    base = text = None
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 6 or parts[5] != exe:
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if int(parts[2], 16) == 0 and base is None:
                base = lo
            if "x" in parts[1]:
                text = (lo, hi)
    if base is None or text is None:
        sys.exit(f"no executable mapping of {exe} in process {pid}")
    return exe, base, text


def resident_pages(pid, lo, hi):
    with open(f"/proc/{pid}/pagemap", "rb") as pm:
        for va in range(lo, hi, PAGE):
            pm.seek(va // PAGE * 8)
            entry = struct.unpack("<Q", pm.read(8))[0]
            if entry >> 63:
                yield va


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pid", type=int)
    ap.add_argument("--order", default=os.path.join(ROOT, "tailrace", "symbol-order.txt"))
    a = ap.parse_args()

    exe, base, (lo, hi) = mappings(a.pid)
    with open(a.order) as f:
        ordered = {line.strip() for line in f if line.strip()}
    nm = subprocess.run(["nm", "-S", "--defined-only", exe], capture_output=True, text=True, check=True)
    end = 0
    for line in nm.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] in ordered:
            end = max(end, int(parts[0], 16) + int(parts[1], 16))
    if end == 0:
        sys.exit(f"none of the functions of {a.order} is in {exe}: was it linked with that list?")

    pages = [va - base for va in resident_pages(a.pid, lo, hi)]
    inside = sum(1 for p in pages if p < end)
    outside = [p for p in pages if p >= end]
    blocks = {p // BLOCK for p in outside}
    mib = PAGE / 2**20
    print(f"text resident: {len(pages)} pages ({len(pages) * mib:.1f} MiB)")
    print(f"  among the ordered functions: {inside} ({inside * mib:.1f} MiB)")
    print(f"  outside them: {len(outside)} ({len(outside) * mib:.1f} MiB) in {len(blocks)} blocks of 128 KiB")


if __name__ == "__main__":
    main()
