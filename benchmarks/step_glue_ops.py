"""Count the "glue" torch ops of one graphed decode step: the ops outside registered kernels, each of
which is one small kernel launch inside a CUDA graph on a GPU (a few us each on an H200).

    python benchmarks/step_glue_ops.py [--topology flash|mixed] [--batch 4]

Runs on the CPU: a tiny V4.1 checkpoint, a PagedExecutor whose graph runner wraps the captured step
function in a ``TorchDispatchMode``, one prefill and one decode step. Every aten op with a registered
kernel implementation on its Python stack (any callable the kernel registry has loaded: one or a few
launches on a GPU, whatever the CPU reference does) is not counted; the rest (index math, cache writes,
model glue, and helpers of ``deepinfer_core/kernels/`` that a model calls directly rather than through the
registry) is listed by source line. View ops are counted too, although they launch nothing; the first line says
how many of the ops are views (``OpOverload.is_view``) and how many launch a kernel. The model runs in fp32, so a
cast to fp32 that launches a kernel in a bf16 model on the GPU (``x.float()``) shows here as a no-op.

Until the twenty-second pass the rule was "the stack passes through ``deepinfer_core/kernels/``", which
also dropped the directly called helpers (the shared expert's ``clamped_swiglu``: five launches a layer).
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _code(fn):
    """The code object a registered callable runs (a function, a bound method, a partial or a callable object)."""
    while hasattr(fn, "func"):  # functools.partial
        fn = fn.func
    fn = getattr(fn, "__wrapped__", fn)
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
    return code or getattr(getattr(type(fn), "__call__", None), "__code__", None)


class GlueOps(TorchDispatchMode):
    """Counts aten ops outside registered kernels by (file:line:function) and by op."""

    def __init__(self):
        super().__init__()
        self.by_line: collections.Counter = collections.Counter()
        self.by_op: collections.Counter = collections.Counter()
        self.views = 0  # ops that only alias their input (``OpOverload.is_view``): no kernel on a GPU
        self._codes: set = set()
        self._seen = 0

    def _kernel_codes(self) -> set:
        """Code objects of every implementation the registry has loaded (refreshed when it loads more)."""
        from deepinfer_core.kernels.registry import get_registry

        loaded = get_registry()._loaded
        if len(loaded) != self._seen:
            self._codes = {c for c in map(_code, loaded.values()) if c is not None}
            self._seen = len(loaded)
        return self._codes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        codes = self._kernel_codes()
        f, inside = sys._getframe(1), False
        while f is not None and not inside:
            inside = f.f_code in codes
            f = f.f_back
        if not inside:
            frames = [fr for fr in traceback.extract_stack()  # the repository's own files (a venv may live in it)
                      if fr.filename.startswith(str(ROOT)) and fr.filename != __file__
                      and "site-packages" not in fr.filename]
            if frames:
                fr = frames[-1]
                self.by_line[f"{Path(fr.filename).relative_to(ROOT)}:{fr.lineno}:{fr.name}"] += 1
                self.by_op[str(func.overloadpacket)] += 1
                self.views += int(bool(getattr(func, "is_view", False)))
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", default="flash", choices=["flash", "mixed"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    from deepinfer_core.runner.executor import PagedExecutor
    from deepinfer_core.runner.simple_driver import run_requests
    from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint
    from deepinfer_models.deepseek_v41.loading import load_deepseek_v41

    counter = GlueOps()

    def runner(fn):  # the first call of a signature is the one a capture records
        seen = set()

        def run(*a, **kw):
            if kw["layout"] in seen:
                return fn(*a, **kw)
            seen.add(kw["layout"])
            with counter:
                return fn(*a, **kw)
        return run

    path = tempfile.mkdtemp(prefix="deepinfer-glue-")
    write_tiny_v41_checkpoint(path, tiny_v41_config(args.topology), quant="fp4", seed=2)
    model = load_deepseek_v41(path, dtype=torch.float32)
    ex = PagedExecutor(model, num_blocks=256, max_num_seqs=args.batch + 2, graph_runner=runner,
                       graph_batch_sizes=(args.batch,), max_context=512)
    lens = [5 + 9 * i for i in range(args.batch)]
    g = torch.Generator().manual_seed(0)
    reqs = [torch.randint(3, 129000, (n + 1,), generator=g).tolist() for n in lens]
    run_requests(ex, reqs, [[(i, n) for i, n in enumerate(lens)], [(i, 1) for i in range(args.batch)]])
    total, layers = sum(counter.by_line.values()), model.cfg.num_hidden_layers
    print(f"V4.1 {args.topology}, {layers} layers, batch {args.batch}: {total} glue ops in one graphed decode step "
          f"({total / layers:.0f} per layer); {total - counter.views} of them launch a kernel ({counter.views} views)")
    for where, n in counter.by_line.most_common(args.top):
        print(f"{n:6d}  {where}")
    by_file = collections.Counter()
    for where, n in counter.by_line.items():
        by_file[where.rsplit(":", 2)[0] + ":" + where.rsplit(":", 1)[1]] += n
    print("by function:", ", ".join(f"{k} {v}" for k, v in by_file.most_common(10)))
    print("by op:", ", ".join(f"{k} {v}" for k, v in counter.by_op.most_common(15)))


if __name__ == "__main__":
    main()
