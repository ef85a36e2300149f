"""``index.candidate_mask`` in two launches: the scores outside a row's candidate blocks set to -inf.

Why (forty-second pass, ``docs/perf/pass42d``, H200 timeline of a V4.1 batch-1 step): the reference is 12 torch ops
(a zeroed bitmap, the block ids' range check, a scatter, the column-to-block gather, the masked fill). Each is a
launch of its own on the chain of a candidate consumer layer, in front of its top-k: 25 us of the step at one
token in the 8-layer slice, which has one consumer (V4.1-Flash has four). Here:

1. ``torch.full``: the output [T, N] at -inf;
2. one program per (row, ``KB`` listed blocks) copies each listed block's ``block_size`` scores into the output.
   Ids outside ``[0, ceil(N / block_size))`` (``-1`` = none) copy nothing, and a repeated id copies the same
   scores twice.

The result is the reference's value for value (a copy, no arithmetic; NaN scores stay NaN where kept). The rows do
not interact, so it is batch-invariant. The block ids need not be sorted: the reference's ``index.candidate_blocks``
lists them best first, the nvidia one in ascending order.

``DEEPINFER_NV_CANDIDATE_MASK=0`` runs the reference.
"""
from __future__ import annotations

import logging
import os

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError

from deepinfer_core.kernels.ops.candidates import candidate_mask
from deepinfer_nvidia.kernels._common import hand_off, on_cuda

logger = logging.getLogger(__name__)
# On by default. Its device test (deepinfer_nvidia/tests/test_conformance_topk.py::test_candidate_mask) passed on an
# H100 in the forty-third pass (pass43a), and the V4.1 batch-1 step went 2.17 -> 2.14 ms pipelined there (-30 us,
# alternated twice; batch 32 -35 us). A kernel that does not compile on the device falls back to the reference once,
# with a warning, as ``triton_kv``'s do.
CANDIDATE_MASK_KERNEL = os.environ.get("DEEPINFER_NV_CANDIDATE_MASK", "1") == "1"
_KB = 128  # listed blocks a program
_FAILED: list[bool] = []  # the kernel failed to compile here: the reference from then on


@triton.jit
def _keep_blocks_kernel(s_ptr, b_ptr, out_ptr, N, NB, K, stride_s, stride_b, BS: tl.constexpr, KB: tl.constexpr):
    """out [T, N] (already -inf): row r's scores of each of its listed blocks ``b_ptr[r, k]`` copied in."""
    r = tl.program_id(0).to(tl.int64)
    kk = tl.program_id(1) * KB + tl.arange(0, KB)
    blk = tl.load(b_ptr + r * stride_b + kk, mask=kk < K, other=-1).to(tl.int64)
    ok = (blk >= 0) & (blk < NB)
    c = blk[:, None] * BS + tl.arange(0, BS)[None, :]
    m = ok[:, None] & (c < N)
    x = tl.load(s_ptr + r * stride_s + c, mask=m)
    tl.store(out_ptr + r * N + c, x, mask=m)


def supports_candidate_mask(scores: torch.Tensor, blocks: torch.Tensor, block_size: int) -> bool:
    bs = int(block_size)
    return (on_cuda(scores, blocks) and scores.dim() == 2 and blocks.dim() == 2 and scores.is_floating_point()
            and blocks.dtype == torch.long and blocks.shape[0] == scores.shape[0]
            and 0 < bs <= 1024 and bs & (bs - 1) == 0)


def candidate_mask_triton(scores: torch.Tensor, blocks: torch.Tensor, block_size: int,
                          force_kernel: bool = False) -> torch.Tensor:
    """``index.candidate_mask``: scores [T, N] (float), blocks [T, K] int64 block ids (-1 = none) -> [T, N] in
    scores' dtype, every entry outside the listed blocks -inf. ``force_kernel``: CPU tensors in Triton's
    interpreter (tests only)."""
    if not force_kernel and (not CANDIDATE_MASK_KERNEL or _FAILED):
        return candidate_mask(scores, blocks, block_size)
    if not (force_kernel or supports_candidate_mask(scores, blocks, block_size)):
        return hand_off("index.candidate_mask", f"scores {scores.dtype} {tuple(scores.shape)} on {scores.device}, "
                        f"blocks {blocks.dtype} {tuple(blocks.shape)}, block {block_size} not covered",
                        candidate_mask, scores, blocks, block_size)
    t, n = scores.shape
    k, bs = blocks.shape[1], int(block_size)
    out = torch.full((t, n), float("-inf"), dtype=scores.dtype, device=scores.device)
    if t == 0 or n == 0 or k == 0:
        return out
    s = scores if scores.stride(1) == 1 else scores.contiguous()
    b = blocks if blocks.stride(1) == 1 else blocks.contiguous()
    try:
        _keep_blocks_kernel[(t, triton.cdiv(k, _KB))](s, b, out, n, triton.cdiv(n, bs), k, s.stride(0), b.stride(0),
                                                      BS=bs, KB=_KB)
    except CompilationError as exc:
        _FAILED.append(True)
        logger.warning("index.candidate_mask: the Triton kernel did not compile (%s); using the torch reference", exc)
        return candidate_mask(scores, blocks, block_size)
    return out
