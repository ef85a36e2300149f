"""Summarise Nsight Compute's per-instruction warp-stall samples (``ncu -i REP --page source --print-source sass
--csv``, as ``pass38.sh stalls`` writes them) on any machine:

    python -m deepinfer_nvidia.tests.ncu_sass_stalls stalls_sass.csv [--top 25]

For each kernel in the file: the samples by stall reason, the instructions holding the most samples with their
main reasons, and the samples of the prologue, the main loop (the longest backward branch's body) and the epilogue.
ncu charges a sample to the instruction a warp waits to issue, so a wait shows on the instruction after it.
"""
from __future__ import annotations

import argparse
import collections
import csv
import re

_ALL = "Warp Stall Sampling (All Samples)"


def kernels(path: str) -> list[tuple[dict, list[list[str]]]]:
    """[(column index by name, SASS rows)] for each kernel section of the CSV."""
    out: list[tuple[dict, list[list[str]]]] = []
    for r in csv.reader(open(path)):
        if r and r[0] == "Kernel Name":
            out.append(({}, []))
        elif r and r[0] == "Address" and out:
            out[-1][0].update({n: i for i, n in enumerate(r)})
        elif r and r[0].startswith("0x") and out:
            out[-1][1].append(r)
    return out


def _reasons(head: dict) -> list[str]:
    return [n for n in head if n.startswith("stall_") and "(Not Issued)" not in n]


def _count(head: dict, rows: list[list[str]]) -> tuple[int, collections.Counter]:
    c: collections.Counter = collections.Counter()
    for r in rows:
        for n in _reasons(head):
            c[n[6:]] += int(r[head[n]] or 0)
    return sum(int(r[head[_ALL]] or 0) for r in rows), c


def main_loop(rows: list[list[str]]) -> tuple[int, int]:
    """(first, last) row of the longest backward branch's body."""
    addr = {int(r[0], 16): i for i, r in enumerate(rows)}
    best = (0, -1)
    for i, r in enumerate(rows):
        m = re.search(r"BRA (0x[0-9a-f]+)", r[1])
        if m and int(m.group(1), 16) in addr and addr[int(m.group(1), 16)] < i:
            lo = addr[int(m.group(1), 16)]
            best = max(best, (lo, i), key=lambda b: b[1] - b[0])
    return best


def summary(path: str, top: int = 25) -> str:
    lines = []
    for k, (head, rows) in enumerate(kernels(path)):
        total, reasons = _count(head, rows)
        lines.append(f"=== kernel {k}: {len(rows)} SASS lines, {total} samples")
        lines.append("   " + ", ".join(f"{n} {v} ({100 * v / max(total, 1):.0f}%)" for n, v in reasons.most_common(12)))
        ranked = sorted(rows, key=lambda r: -int(r[head[_ALL]] or 0))[:top]
        for r in ranked:
            per = {n[6:]: int(r[head[n]] or 0) for n in _reasons(head) if int(r[head[n]] or 0)}
            main = " ".join(f"{n}={v}" for n, v in sorted(per.items(), key=lambda kv: -kv[1])[:4])
            lines.append(f"  {int(r[head[_ALL]] or 0):5d} {r[1].strip()[:60]:60s} {main}")
        lo, hi = main_loop(rows)
        for name, part in (("prologue", rows[:lo]), ("loop", rows[lo:hi + 1]), ("epilogue", rows[hi + 1:])):
            n, c = _count(head, part)
            lines.append(f"  {name:9s} {len(part):4d} lines {n:5d} samples ({100 * n / max(total, 1):.0f}%): "
                         + ", ".join(f"{r} {v}" for r, v in c.most_common(7)))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    print(summary(args.csv, args.top))


if __name__ == "__main__":
    main()
