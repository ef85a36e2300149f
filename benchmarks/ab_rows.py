"""A/B summary of the device scripts' alternated sweep rows (``deepinfer_nvidia/tests/passes/pass_lib.sh``: ``v41_alt``,
``rows_vals``, ``v41_row``): per label and decode row, the pipelined ms of each reading, their mean, the change
from the mean of the first label with that row, and whether every reading of a label beats every baseline reading.

    python benchmarks/ab_rows.py docs/perf/pass36c/rows_vals.txt [more logs ...]

A log is blocks of ``== LABEL`` followed by the sweep's row lines (``+graphs   decode B=1 ... pipelined 1.93 ms``);
a label that comes back (A / B / A / B) collects its readings. Rows without a pipelined reading are skipped. Each
file is summarised on its own (its labels share one process setup, so only they are comparable).
"""
from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

_ROW = re.compile(r"decode (B=\d+(?: ctx=\d+)?)\b.*?pipelined ([0-9.]+) ms")


def readings(text: str) -> dict[str, dict[str, list[float]]]:
    """``{label: {row: [pipelined ms, ...]}}`` in first-seen label order, from one log's text."""
    out: dict[str, dict[str, list[float]]] = {}
    label = None
    for line in text.splitlines():
        if line.startswith("== "):
            label = line[3:].strip()
            out.setdefault(label, {})
            continue
        m = _ROW.search(line)
        if m and label is not None:
            out[label].setdefault(m.group(1), []).append(float(m.group(2)))
    return out


def summarise(data: dict[str, dict[str, list[float]]]) -> list[dict]:
    """One entry a (label, row): readings, mean, the change from the mean of the first label with that row (ms and
    %), and ``separated``: every reading below (``faster``) or above (``slower``) every baseline reading, else
    ``overlap``."""
    first: dict[str, str] = {}  # row -> the first label that has it: that row's baseline
    for label, rows in data.items():
        for row in rows:
            first.setdefault(row, label)
    out = []
    for label, rows in data.items():
        for row, vals in rows.items():
            base = data[first[row]][row]
            entry = {"label": label, "row": row, "ms": vals, "mean": statistics.fmean(vals)}
            if label != first[row]:
                b = statistics.fmean(base)
                entry["delta_ms"] = entry["mean"] - b
                entry["delta_pct"] = 100.0 * (entry["mean"] - b) / b
                entry["separated"] = ("faster" if max(vals) < min(base) else "slower" if min(vals) > max(base)
                                      else "overlap")
            out.append(entry)
    return out


def report(path: Path) -> str:
    lines = [f"{path}:"]
    for e in summarise(readings(path.read_text())):
        vals = " / ".join(f"{v:.2f}" for v in e["ms"])
        delta = (f"  {e['delta_ms'] * 1e3:+7.0f} us ({e['delta_pct']:+.1f}%), {e['separated']}"
                 if "delta_ms" in e else "  (baseline)")
        lines.append(f"  {e['label'][:48]:48s} {e['row']:16s} {vals:28s} mean {e['mean']:.3f} ms{delta}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", type=Path)
    for path in ap.parse_args().logs:
        print(report(path))


if __name__ == "__main__":
    main()
