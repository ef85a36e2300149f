"""Find the first op whose rows for one request differ between "alone" and "in a batch" (GPU).

    python3 -m deepinfer_nvidia.tests.invariance_debug [bf16|fp32] [bi|default]
"""
from __future__ import annotations

import sys
import tempfile

import torch

from deepinfer_core.kernels.mode import kernel_mode
from deepinfer_core.runner.executor import PagedExecutor
from deepinfer_core.runner.simple_driver import run_requests
from deepinfer_models.deepseek_v41.checkpoint_writer import write_tiny_v41_checkpoint
from deepinfer_models.deepseek_v41.loading import load_deepseek_v41


def main() -> None:
    from deepinfer_nvidia.platform import NvidiaPlatform

    dtype = torch.bfloat16 if (sys.argv[1:2] or ["bf16"])[0] == "bf16" else torch.float32
    bi = (sys.argv[2:3] or ["bi"])[0] == "bi"
    gpu = NvidiaPlatform()
    d = tempfile.mkdtemp()
    write_tiny_v41_checkpoint(d, quant="fp8", seed=2)
    with kernel_mode(batch_invariant=bi):
        m = load_deepseek_v41(d, dtype=dtype, device=gpu.device(), platform=gpu,
                              kernel_overrides=None if bi else {"gemm.dense": "aten", "moe.experts": "aten"})
    log = []

    def wrap(name, fn):
        def f(*a, **k):
            out = fn(*a, **k)
            log.append((name, out))
            return out
        return f

    for name in list(m.k):
        m.k[name] = wrap(name, m.k[name])
    g = torch.Generator().manual_seed(1)
    target = torch.randint(3, 129000, (150,), generator=g).tolist()
    others = [torch.randint(3, 129000, (n,), generator=g).tolist() for n in (7, 33, 90, 140, 5, 61, 120)]
    off = sum(len(o) for o in others)
    with torch.inference_mode():
        run_requests(PagedExecutor(m, 512, 2, gpu.device()), [target], [[(0, 150)]])
        la = list(log)
        log.clear()
        reqs = others + [target]
        run_requests(PagedExecutor(m, 512, len(reqs), gpu.device()), reqs, [[(i, len(r)) for i, r in enumerate(reqs)]])
        lb = list(log)
    print(f"{dtype} bi={bi}: {len(la)} vs {len(lb)} op calls")
    for (n1, o1), (n2, o2) in zip(la, lb):
        o1 = o1[0] if isinstance(o1, tuple) else o1
        o2 = o2[0] if isinstance(o2, tuple) else o2
        if not isinstance(o1, torch.Tensor) or o1.dim() == 0 or n1 != n2:
            continue
        if o2.shape[0] == off + 150 and o1.shape[0] == 150:
            o2 = o2[off:]
        if o1.shape != o2.shape:
            continue
        if not torch.equal(o1, o2):
            print("first differing op:", n1, tuple(o1.shape), "max|diff|", (o1.float() - o2.float()).abs().max().item())
            return
    print("no op differs")


if __name__ == "__main__":
    main()
