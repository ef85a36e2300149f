"""Which Python lines launch the costly torch ops of a prefill step (thirteenth pass, for the next one).

    python3 -m deepinfer_nvidia.tests.prefill_stacks --out DIR [--tokens 8192] [--ops aten::copy_,aten::mul]
    python3 -m deepinfer_nvidia.tests.prefill_stacks --device cpu --tiny --tokens 64   # smoke run

The 8k prefill profile of the thirteenth pass showed ``aten::copy_`` at 14.9 ms in 123 calls, plus ~20 ms of
other elementwise ops, without saying where they come from. This builds the sweep's V4.1 slice
(``benchmarks/sweep.py`` helpers), runs one prefill of ``--tokens`` tokens under the torch profiler with Python
stacks, and for each op in ``--ops`` writes its calls grouped by the innermost ``--depth`` frames of this
repository (the launching line first), with the device time of each group. Writes ``prefill_stacks.txt``.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


OWN = ("deepinfer_core/", "deepinfer_models/", "deepinfer_nvidia/", "benchmarks/")


def own_name(frame: str) -> str | None:
    """``.../deepinfer_models/x.py(12): f`` -> ``deepinfer_models/x.py(12): f``; None for frames elsewhere.
    Matched by folder name, not by this file's resolved root: the device's checkout may sit behind a link."""
    if ".py(" not in frame or "prefill_stacks.py" in frame:
        return None
    cut = min((i for i in (frame.find(o) for o in OWN) if i >= 0), default=-1)
    return frame[cut:] if cut >= 0 else None


def own_frames(event, depth: int) -> tuple[str, ...]:
    """The innermost ``depth`` Python frames of this repository above a profiler op event. With ``with_stack``
    the profiler records Python calls as events of their own (``path.py(line): function``), parents of the
    ops they launch; torch's frames and this script's are skipped."""
    mine = []
    for frame in getattr(event, "stack", None) or ():  # torch builds that record stacks on the op itself
        name = own_name(frame)
        if name and len(mine) < depth:
            mine.append(name)
    if mine:
        return tuple(mine)
    parent = event.cpu_parent
    while parent is not None and len(mine) < depth:
        name = own_name(parent.name)
        if name:
            mine.append(name)
        parent = parent.cpu_parent
    return tuple(mine)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ops", default="aten::copy_,aten::mul,aten::add,aten::index,aten::where,aten::pow")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the test checkpoint's widths (smoke runs on the CPU)")
    args = ap.parse_args()
    from torch.profiler import ProfilerActivity, profile

    from benchmarks import sweep
    from benchmarks.sweep_slice import arch_config, build_weights

    sweep.DEV = args.device
    cfg = arch_config("v41", args.layers, [0], "fp4", tiny=args.tiny, engram_vocab=1 << (10 if args.tiny else 20))
    model = sweep.make_model(cfg, build_weights(cfg, args.device), "triton" if args.device == "cuda" else "reference")
    ex, slices, ids = sweep.setup_step(model, cfg, 1, 0, args.tokens,
                                       sweep.step_kernels("triton" if args.device == "cuda" else "reference"))

    def step():
        with torch.inference_mode():
            model.compute_logits(ex.run(ids, slices)[-1:])
        sweep.sync()

    step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    # verbose: Python function events above the ops. Without it torch 2.11 + CUDA recorded none on the H200
    # (docs/perf/pass14a); not yet tried there with it.
    extra = {}
    try:
        extra["experimental_config"] = torch._C._profiler._ExperimentalConfig(verbose=True)
    except (AttributeError, TypeError):
        pass
    with profile(activities=acts, with_stack=True, record_shapes=True, **extra) as prof:
        step()
    wanted = set(args.ops.split(","))
    chain = []  # the parent chain of the first wanted op, to show what the profiler recorded above it
    for ev in prof.events():
        if ev.name in wanted:
            parent, chain = ev.cpu_parent, [f"first {ev.name}: stack {list(getattr(ev, 'stack', None) or [])[:6]}"]
            while parent is not None and len(chain) < 14:
                chain.append(f"  parent {parent.name[:160]}")
                parent = parent.cpu_parent
            break
    groups: dict[tuple[str, tuple[str, ...]], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for ev in prof.events():
        if ev.name not in wanted:
            continue
        key = (ev.name, own_frames(ev, args.depth))
        g = groups[key]
        g[0] += 1
        g[1] += getattr(ev, "device_time_total", 0.0) or 0.0
        g[2] += ev.cpu_time_total
    lines = [f"prefill of {args.tokens} tokens, V4.1 {args.layers} layers{' (tiny)' if args.tiny else ''}, "
             f"device {args.device}: ops {sorted(wanted)} grouped by their innermost {args.depth} frames here"]
    for (name, frames), (n, dev_us, cpu_us) in sorted(groups.items(), key=lambda kv: -(kv[1][1] or kv[1][2])):
        lines.append(f"{name:14s} calls {n:4d}  device {dev_us / 1e3:8.3f} ms  cpu {cpu_us / 1e3:8.3f} ms")
        lines += [f"    {f}" for f in frames] or ["    (no frame in this repository)"]
    # The whole step's ops by device time, for the groups above to be read against.
    table = prof.key_averages().table(sort_by="device_time_total" if args.device == "cuda" else "cpu_time_total",
                                      row_limit=40, max_name_column_width=70)
    lines += ["", *chain, "", "all ops of the step by device time:", table]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "prefill_stacks.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:60]), flush=True)


if __name__ == "__main__":
    main()
