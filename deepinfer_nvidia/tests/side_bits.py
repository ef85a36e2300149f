"""The side stream changes no bit of a model's output: greedy decoding on the GPU with ``stream.side`` branches on
and off, every step's logits compared bit for bit.

    python3 -m deepinfer_nvidia.tests.side_bits        # needs a CUDA device

Tiny generated V4 (FP8 experts) and V4.1 (MXFP4 experts) checkpoints in bf16, three prompts (a prefill of 420 rows
runs in order: over ``SIDE_MAX_ROWS``), then 24 decode steps of 3 rows each, where the MoE layers' shared
experts run on the side stream. The branch runs the same kernels on the same operands as the in-order launch, so
the logits of every step must be equal, not close.
"""
from __future__ import annotations

import tempfile

import torch

from deepinfer_nvidia.tests.parity_tiny import greedy


def main() -> None:
    from deepinfer_models.deepseek_v4.loading import load_deepseek_v4
    from deepinfer_models.deepseek_v41.checkpoint_writer import write_tiny_v41_checkpoint
    from deepinfer_models.deepseek_v41.loading import load_deepseek_v41
    from deepinfer_models.testing import write_tiny_v4_checkpoint
    from deepinfer_nvidia.kernels import cuda_side_stream as css
    from deepinfer_nvidia.platform import NvidiaPlatform

    gpu = NvidiaPlatform()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (20, 140, 260)]
    failed = []
    saved = css.SIDE_STREAM
    for name, write, load, quant in (("V4", write_tiny_v4_checkpoint, load_deepseek_v4, "fp8"),
                                     ("V4.1", write_tiny_v41_checkpoint, load_deepseek_v41, "fp4")):
        d = tempfile.mkdtemp()
        write(d, quant=quant, seed=1)
        model = load(d, dtype=torch.bfloat16, device=gpu.device(), platform=gpu)
        runs = {}
        for on in (False, True, False, True):
            css.SIDE_STREAM = on
            with torch.inference_mode():
                runs.setdefault(on, []).append(greedy(model, prompts, 24, gpu.device()))
        (t_off, l_off), (t_on, l_on) = runs[False][0], runs[True][0]
        same_tokens = t_off == t_on and all(r[0] == t_off for rs in runs.values() for r in rs)
        unequal = [i for i, (a, b) in enumerate(zip(l_off, l_on)) if not torch.equal(a, b)]
        repeat = all(torch.equal(a, b) for rs in runs.values() for a, b in zip(rs[0][1], rs[1][1]))
        print(f"{name}: tokens equal on/off {same_tokens}; steps with unequal logits {unequal} of {len(l_off)}; "
              f"each setting repeats its bits {repeat}")
        if not same_tokens or unequal or not repeat:
            failed.append(name)
    css.SIDE_STREAM = saved
    if failed:
        raise SystemExit(f"side stream changed bits: {failed}")
    print("side bits ok")


if __name__ == "__main__":
    main()
