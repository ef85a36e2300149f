"""One plot from several device calls of ``benchmarks/sweep.py``: their ``sweep.json`` files and the graphed rows
that ``deepinfer_nvidia/tests/passes/pass_lib.sh``'s ``v41_row`` printed (whose JSON it does not keep).

    python benchmarks/plot_sweeps.py --json docs/perf/pass36g/sweep.json docs/perf/pass36f/sweep.json \
        --log docs/perf/pass36h/ab_rows.txt --section "pass 36 defaults" --out docs/perf/pass36_h200.png

A logged row gives its graphed and pipelined times and the pipelined ratio to the roofline, so its roofline is
recovered as ``pipelined / ratio`` (to the printed digits). Where several readings of a label are given, the fastest
pipelined one is plotted (the last ``--section`` block's rows only, when a section is named). Each provider is a
bar series, the pipelined times one more (``triton+graphs pipelined``), beside the roofline bar.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_ROW = re.compile(r"\+graphs\s+(decode B=\d+(?: ctx=\d+)?)\s+([\d.]+) ms .*pipelined ([\d.]+) ms \(x([\d.]+)\)")


def rows_from_log(text: str, section: str | None) -> list[dict]:
    """Graphed rows of a ``v41_row`` log (``== label`` headers): every block, or the blocks headed ``section``."""
    rows, keep = [], section is None
    for line in text.splitlines():
        if line.startswith("== "):
            keep = section is None or line[3:].strip() == section
            continue
        m = _ROW.search(line)
        if keep and m:
            label, ms, pipe, x = m.group(1), float(m.group(2)), float(m.group(3)), float(m.group(4))
            rows.append({"provider": "triton+graphs", "label": label, "ms": ms, "pipelined_ms": pipe,
                         "roofline_ms": pipe / x})
    return rows


def merge(jsons: list[dict], logged: list[dict]) -> dict:
    """The first JSON's config and device with every row: per (provider, label) the fastest pipelined reading (or
    the fastest one where none is pipelined); the pipelined times as their own series."""
    best: dict[tuple, dict] = {}
    for row in [r for j in jsons for r in j["rows"] if "ms" in r] + logged:
        key = (row["provider"], row["label"])
        speed = row.get("pipelined_ms") or row["ms"]
        if key not in best or speed < (best[key].get("pipelined_ms") or best[key]["ms"]):
            best[key] = row
    rows = list(best.values())
    rows += [{"provider": f"{r['provider']} pipelined", "label": r["label"], "ms": r["pipelined_ms"],
              "roofline_ms": r["roofline_ms"]} for r in list(rows) if r.get("pipelined_ms")]
    base = jsons[0] if jsons else {"config": {"arch": "v41", "layers": "?"}}
    return {"config": base["config"], "device": base.get("device", ""), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", nargs="*", default=[])
    ap.add_argument("--log", nargs="*", default=[])
    ap.add_argument("--section", default=None, help="only the log blocks headed '== SECTION'")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from benchmarks.sweep import plot

    jsons = [json.loads(Path(p).read_text()) for p in args.json]
    logged = [r for p in args.log for r in rows_from_log(Path(p).read_text(), args.section)]
    results = merge(jsons, logged)
    plot(results, args.out)
    for r in sorted(results["rows"], key=lambda r: (r["label"], r["provider"])):
        print(f"{r['provider']:26s} {r['label']:22s} {r['ms']:9.2f} ms  roofline {r['roofline_ms']:8.3f} ms  "
              f"x{r['ms'] / r['roofline_ms']:.2f}")


if __name__ == "__main__":
    main()
