"""FlashMLA (deepseek-ai/FlashMLA, import name ``flash_mla``) as the ``flashmla`` provider of
``attention.sparse_sink``.

NOT RUN HERE: no machine of this project has FlashMLA installed (it builds from source against CUDA, and the
H200 that measures this project reaches no index). The adapter is written against the public Python API of
FlashMLA at commit 9241ae3 (2026-04-29, ``flash_mla/flash_mla_interface.py``); its argument marshalling is
checked on the CPU against a torch model of that documented contract (``tests/kernels/test_vendor_flashmla.py``),
not against the library. The platform puts this provider first only on SM100 and only when ``flash_mla``
imports (``vendors.vendor_providers``); everything it does not cover goes to the Triton kernel.

Which entry point: ``flash_mla_sparse_fwd(q [s_q, h_q, d_qk] bf16, kv [s_kv, 1, d_qk] bf16,
indices [s_q, 1, topk] int32, sm_scale, d_v, attn_sink [h_q] fp32) -> (out [s_q, h_q, d_v] bf16, max_logits,
lse)``. Its indices are rows of one flat bf16 KV tensor (-1 or >= s_kv: no entry), which is how this project's
caches already are, so it serves decode and prefill alike. FlashMLA's decode kernel
(``flash_mla_with_kvcache`` with ``indices``) needs the FP8 "MODEL1" cache record (584 B a token), which the
bf16 caches here are not; it is not used. The sink is an extra logit in the softmax denominator with no value
vector, the same definition as the op's.

Library limits the adapter meets: h_q exactly 64 or 128 (heads are padded with zero queries and ``-inf``
sinks, then dropped), d_qk = d_v = 512, topk a multiple of 128 (index lists padded with -1).
"""
from __future__ import annotations

import torch

from deepinfer_nvidia.kernels._common import on_cuda
from deepinfer_nvidia.kernels.vendors import arch_of, importable

HEAD_SIZES = (64, 128)  # h_q the kernels take
HEAD_DIM = 512  # d_qk = d_v of the V4 record ("MODEL1"); 576 is V3.2's, with a separate 512-dim value
TOPK_MULTIPLE = 128  # SM90 and SM100's regular head-128 kernel need 128; 64 would do for the others
ARCHS = (9, 10)  # compute capability majors FlashMLA's sparse prefill is built for (SM90a, SM100f)


def supports(q, kv_a, idx_a, kv_b, idx_b, sinks, scale) -> bool:
    """CUDA bf16 q [T, H <= 128, 512] and bf16 caches [S, 512] with int64 index lists, on an SM90/SM100 device
    with ``flash_mla`` importable."""
    if not on_cuda(q, kv_a, idx_a, kv_b, idx_b, sinks) or not importable("flash_mla"):
        return False
    if q.dtype != torch.bfloat16 or q.dim() != 3 or q.shape[1] > HEAD_SIZES[-1] or q.shape[2] != HEAD_DIM:
        return False
    if arch_of(q.device)[0] not in ARCHS:
        return False
    caches = [kv_a] + ([kv_b] if kv_b is not None else [])
    idxs = [idx_a] + ([idx_b] if idx_b is not None else [])
    return (all(c.dtype == torch.bfloat16 and c.dim() == 2 and c.shape[1] == HEAD_DIM for c in caches)
            and all(i.dtype == torch.int64 and i.dim() == 2 and i.shape[0] == q.shape[0] for i in idxs))


def sparse_sink(q: torch.Tensor, kv_a: torch.Tensor, idx_a: torch.Tensor, kv_b: torch.Tensor | None,
                idx_b: torch.Tensor | None, sinks: torch.Tensor, scale: float) -> torch.Tensor:
    """``attention.sparse_sink`` through FlashMLA (see the op's reference): [T, H, D] in q.dtype. Operands it
    does not cover go to the Triton kernel (which hands what it does not cover to the reference)."""
    from deepinfer_nvidia.kernels import triton_attention

    if not supports(q, kv_a, idx_a, kv_b, idx_b, sinks, scale):
        return triton_attention.sparse_sink(q, kv_a, idx_a, kv_b, idx_b, sinks, scale)
    triton_attention._check(q, kv_a, idx_a, kv_b, idx_b, sinks)
    import flash_mla

    return call_sparse_fwd(flash_mla.flash_mla_sparse_fwd, q, kv_a, idx_a, kv_b, idx_b, sinks, scale)


def flat_kv_and_indices(kv_a: torch.Tensor, idx_a: torch.Tensor, kv_b: torch.Tensor | None,
                        idx_b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One flat KV tensor and int32 rows into it for the op's two caches: ``(kv [S, D], rows [T, N])`` with
    N = Na + Nb and -1 for no entry.

    FlashMLA reads one tensor and the caches are two allocations, so one of two workspaces is built, whichever
    has fewer rows (both sizes follow from the shapes alone, so a CUDA graph can hold either):
    - the two caches end to end (Sa + Sb rows; idx_b shifted by Sa): long prefills, where many tokens share rows;
    - each token's own rows gathered in order (T * N rows; rows are then ``t * N + n``): decode, where a step
      reads far fewer rows than the caches hold.
    With one cache the cache itself is used (no copy).
    """
    has_b = kv_b is not None and idx_b is not None and idx_b.shape[1] > 0
    if not has_b:
        return kv_a, idx_a.to(torch.int32)
    t, na, nb = idx_a.shape[0], idx_a.shape[1], idx_b.shape[1]
    valid = torch.cat([idx_a >= 0, idx_b >= 0], dim=1)  # [T, N]
    if t * (na + nb) < kv_a.shape[0] + kv_b.shape[0]:
        kv = torch.cat([kv_a[idx_a.clamp(min=0)], kv_b[idx_b.clamp(min=0)]], dim=1).reshape(-1, kv_a.shape[1])
        rows = torch.arange(t * (na + nb), device=idx_a.device, dtype=torch.int32).view(t, na + nb)
    else:
        kv = torch.cat([kv_a, kv_b], dim=0)
        rows = torch.cat([idx_a, idx_b + kv_a.shape[0]], dim=1).to(torch.int32)
    return kv, torch.where(valid, rows, torch.full_like(rows, -1))


def call_sparse_fwd(fwd, q: torch.Tensor, kv_a: torch.Tensor, idx_a: torch.Tensor, kv_b: torch.Tensor | None,
                    idx_b: torch.Tensor | None, sinks: torch.Tensor, scale: float) -> torch.Tensor:
    """Marshal the op's operands into ``fwd`` (``flash_mla_sparse_fwd``'s signature) and back: q [T, H, 512]
    bf16 -> [T, H, 512] bf16. Tokens with no valid slot get zeros (the op's definition), whatever the library
    returns for them."""
    t, h, d = q.shape
    hp = next(s for s in HEAD_SIZES if s >= h)
    kv, rows = flat_kv_and_indices(kv_a, idx_a, kv_b, idx_b)
    n = rows.shape[1]
    npad = max(TOPK_MULTIPLE, -(-n // TOPK_MULTIPLE) * TOPK_MULTIPLE)
    indices = torch.full((t, 1, npad), -1, dtype=torch.int32, device=q.device)
    indices[:, 0, :n] = rows
    qp = q if hp == h else torch.cat([q, q.new_zeros(t, hp - h, d)], dim=1)
    sink = sinks.float()
    if hp != h:
        sink = torch.cat([sink, sink.new_full((hp - h,), float("-inf"))])
    out = fwd(qp.contiguous(), kv.contiguous().unsqueeze(1), indices, float(scale), d_v=d,
              attn_sink=sink.contiguous())[0]
    out = out[:, :h]
    any_valid = (rows >= 0).any(dim=1)
    return torch.where(any_valid[:, None, None], out, torch.zeros_like(out)).to(q.dtype)
