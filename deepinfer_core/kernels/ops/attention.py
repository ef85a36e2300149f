"""Sparse shared-KV MQA with per-head attention sinks (DeepSeek-V4 attention core).

Every query token attends to an explicit list of cache slots (sliding-window
entries of its own layer plus selected compressed entries), FlashMLA-sparse
style. One KV vector per slot serves as key and value.

``attention.sparse_sink_rope`` is the fused op the models call (``OpSpec.components``): the query's RoPE, the
attention, and the inverse RoPE of the output, as V4's attention runs them.
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.linalg import down
from deepinfer_core.kernels.ops.rope import apply_rope, default_inv_freq
from deepinfer_core.kernels.spec import OpSpec, acc


def sparse_attention_sink(q: torch.Tensor, kv_a: torch.Tensor, idx_a: torch.Tensor,
                          kv_b: torch.Tensor | None, idx_b: torch.Tensor | None,
                          sinks: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of each query over gathered KV slots from up to two caches.

    q [T, H, D]; kv_a [Sa, D] / kv_b [Sb, D] flat caches; idx_a [T, Na] / idx_b [T, Nb] int64 slot
    indices, -1 = no entry; sinks [H] fp32 (only in the softmax denominator); scale = D^-0.5 usually.
    Returns [T, H, D] in q.dtype. Computed in fp32. A row with no valid slot returns zeros.
    """
    keys = [kv_a[idx_a.clamp(min=0)]]
    valid = [idx_a >= 0]
    if kv_b is not None and idx_b is not None and idx_b.shape[1] > 0:
        keys.append(kv_b[idx_b.clamp(min=0)])
        valid.append(idx_b >= 0)
    # In fp64 whatever the input dtype: the number of gathered slots N depends on the
    # batch, and BLAS reduction orders depend on N (seen on MKL and on cuBLAS); in fp64
    # those differences vanish when the result is rounded back (fp32 accumulation was
    # not enough for bf16 inputs on the GPU).
    k = torch.cat(keys, dim=1).double()  # [T, N, D]
    ok = torch.cat(valid, dim=1)  # [T, N]
    logits = torch.einsum("thd,tnd->thn", q.double(), k) * scale
    logits = logits.masked_fill(~ok[:, None, :], float("-inf"))
    sink = sinks.to(logits.dtype).view(1, -1, 1).expand(q.shape[0], -1, 1)
    full = torch.cat([logits, sink], dim=-1)
    p = (full - full.amax(dim=-1, keepdim=True)).softmax(dim=-1)[..., :-1]
    return down(torch.einsum("thn,tnd->thd", p, k), acc(q)).to(q.dtype)


def _gen_attention(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, h, d, sa, na, sb, nb in [(3, 2, 16, 10, 4, 0, 0), (7, 4, 64, 40, 8, 12, 5), (5, 8, 512, 64, 16, 32, 8)]:
        q = torch.randn(t, h, d, generator=g).to(dtype).to(device)
        kv_a = torch.randn(sa, d, generator=g).to(dtype).to(device)
        idx_a = torch.randint(-1, sa, (t, na), generator=g).to(device)
        kv_b = torch.randn(max(sb, 1), d, generator=g).to(dtype).to(device) if sb else None
        idx_b = torch.randint(-1, sb, (t, nb), generator=g).to(device) if sb else None
        sinks = torch.randn(h, generator=g).float().to(device)
        yield (q, kv_a, idx_a, kv_b, idx_b, sinks, d ** -0.5), {}


SINK_ROPE_PARTS = ("rope.interleaved", "attention.sparse_sink")


def compose_sparse_sink_rope(k: dict):
    """``attention.sparse_sink_rope`` from its parts ``k`` (``{op: callable}`` for ``SINK_ROPE_PARTS``)."""
    rope, attend = k["rope.interleaved"], k["attention.sparse_sink"]

    def sparse_sink_rope(q: torch.Tensor, kv_a: torch.Tensor, idx_a: torch.Tensor, kv_b: torch.Tensor | None,
                         idx_b: torch.Tensor | None, sinks: torch.Tensor, scale: float, positions: torch.Tensor,
                         inv_freq: torch.Tensor) -> torch.Tensor:
        """q [T, H, D] before its RoPE; the rest as ``attention.sparse_sink``; positions [T] int, inv_freq [R/2]
        fp32. Returns ``rope(attention(rope(q)), inverse=True)`` [T, H, D] in q.dtype, each step rounded to
        q.dtype as the parts store it (the cached KV rows carry their RoPE already)."""
        o = attend(rope(q, positions, inv_freq), kv_a, idx_a, kv_b, idx_b, sinks, scale)
        return rope(o, positions, inv_freq, inverse=True)

    return sparse_sink_rope


sparse_sink_rope = compose_sparse_sink_rope({"rope.interleaved": apply_rope,
                                             "attention.sparse_sink": sparse_attention_sink})


def _gen_attention_rope(dtype, device, seed):
    g = torch.Generator().manual_seed(seed + 7)
    for (q, *rest), _ in _gen_attention(dtype, device, seed):
        t, d = q.shape[0], q.shape[-1]
        pos = torch.randint(0, 70000, (t,), generator=g).to(device)
        yield (q, *rest, pos, default_inv_freq(min(64, d // 2), 10000.0).to(device)), {}


OPS = [OpSpec("attention.sparse_sink", sparse_attention_sink, _gen_attention,
              tolerances={torch.bfloat16: (2e-2, 2e-2)}, doc="sparse shared-KV MQA with sinks"),
       OpSpec("attention.sparse_sink_rope", sparse_sink_rope, _gen_attention_rope,
              tolerances={torch.bfloat16: (3e-2, 3e-2)}, components=SINK_ROPE_PARTS,
              compose=compose_sparse_sink_rope, doc="rope(q), attention.sparse_sink, inverse rope of the output")]
