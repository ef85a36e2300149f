"""What ``DEEPINFER_NV_COMPILE=1`` would launch in one graphed decode step: the step compiled by ``torch.compile``
with every registered kernel opaque, counted on the CPU (a prediction for the GPU, not a GPU measurement).

    python benchmarks/step_glue_compile.py [--batch 1]

Same tiny V4.1 "flash" checkpoint and step as ``step_glue_ops.py`` (which counts the eager glue: 326 ops at
batch 1 on 10 layers). Here the executor's graph runner is ``deepinfer_nvidia.graphs.compiled_step`` and the
model's kernels go through ``opaque_kernel`` (the nvidia platform's ``wrap_kernel`` in that mode). The second
decode step is profiled: registered kernel calls (each wrapped in a named range), the fused kernels inductor
generated (``cpp_fused_*`` on the CPU, one Triton kernel each on a GPU) and the aten ops left outside both
(views launch nothing on a GPU; they are listed by name).
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    import torch._inductor.config as inductor_config

    from deepinfer_core.runner.executor import PagedExecutor
    from deepinfer_core.runner.simple_driver import run_requests
    from deepinfer_models.deepseek_v41.checkpoint_writer import tiny_v41_config, write_tiny_v41_checkpoint
    from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
    from deepinfer_nvidia.graphs import compiled_step, opaque_kernel

    inductor_config.cpp.enable_kernel_profile = True  # fused CPU kernels appear in the profiler by name

    def named(fn):
        def kernel(*a, **kw):
            with torch.profiler.record_function("kernel"):
                return fn(*a, **kw)
        return opaque_kernel(kernel)

    class Platform:  # the nvidia platform's two hooks in compile mode, on the CPU
        name, default_providers = "glue-compile", ()

        def register_kernels(self, registry):
            pass

        wrap_kernel = staticmethod(named)

    counts: dict = {}

    def runner(fn):
        step = compiled_step(fn)
        calls = collections.Counter()

        def run(*a, **kw):
            calls[kw["layout"]] += 1
            if calls[kw["layout"]] != 2:  # the first call compiles; the second is counted
                return step(*a, **kw)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                out = step(*a, **kw)
            left: collections.Counter = collections.Counter()
            kernels = fused = 0
            for e in prof.events():
                ancestors, inside, nested = e.cpu_parent, False, False
                while ancestors is not None:
                    inside |= ancestors.name == "kernel"
                    nested |= ancestors.name.startswith("aten::") or "cpp_fused" in ancestors.name
                    ancestors = ancestors.cpu_parent
                if e.name == "kernel":
                    kernels += 1
                elif not inside and "cpp_fused" in e.name:
                    fused += 1
                elif not inside and not nested and e.name.startswith("aten::"):
                    left[e.name] += 1
            counts.update(kernels=kernels, fused=fused, left=left)
            return out
        return run

    path = tempfile.mkdtemp(prefix="deepinfer-glue-")
    write_tiny_v41_checkpoint(path, tiny_v41_config("flash"), quant="fp4", seed=2)
    model = load_deepseek_v41(path, dtype=torch.float32, platform=Platform())
    ex = PagedExecutor(model, num_blocks=256, max_num_seqs=args.batch + 2, graph_runner=runner,
                       graph_batch_sizes=(args.batch,), max_context=512)
    lens = [5 + 9 * i for i in range(args.batch)]
    g = torch.Generator().manual_seed(0)
    reqs = [torch.randint(3, 129000, (n + 2,), generator=g).tolist() for n in lens]
    decode = [(i, 1) for i in range(args.batch)]
    run_requests(ex, reqs, [[(i, n) for i, n in enumerate(lens)], decode, decode])
    views = {"aten::view", "aten::select", "aten::slice", "aten::reshape", "aten::t", "aten::expand",
             "aten::unsqueeze", "aten::squeeze", "aten::as_strided", "aten::permute", "aten::transpose"}
    left = counts["left"]
    real = {k: v for k, v in left.items() if k not in views}
    print(f"V4.1 flash, {model.cfg.num_hidden_layers} layers, batch {args.batch}, compiled step: "
          f"{counts['kernels']} registered kernel calls, {counts['fused']} fused glue kernels, "
          f"{sum(real.values())} other aten ops that launch ({dict(real)}), "
          f"{sum(left.values()) - sum(real.values())} views")


if __name__ == "__main__":
    main()
