"""MoE routing and expert computation references (DeepSeek-V4 style)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer_core.kernels.ops.gemm import dense_wide
from deepinfer_core.kernels.ops.linalg import down, linear_rows, up
from deepinfer_core.kernels.ops.quant import dequant_fp8_block, dequant_mxfp4, quant_fp8_block, quant_mxfp4
from deepinfer_core.kernels.ops.linalg import up as _up
from deepinfer_core.kernels.ops.mxfp4_words import expert_bytes, experts_mxfp4_layout, to_word_layout
from deepinfer_core.kernels.spec import OpSpec, acc


def sqrtsoftplus(logits: torch.Tensor) -> torch.Tensor:
    """``sqrt(softplus(x))`` in fp32."""
    x = acc(logits)
    return down(F.softplus(up(x)), x).sqrt()


def route_topk(logits: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Biased sqrtsoftplus top-k routing.

    logits [T, E] fp32 router output; bias [E] fp32 correction bias (selection only).
    Returns ``(weights [T, k] fp32, ids [T, k] int64)`` with weights = s_sel / sum(s_sel) * scaling.
    """
    s = sqrtsoftplus(logits)
    ids = torch.topk(s + acc(bias), top_k, dim=-1).indices
    w = s.gather(1, ids)
    return w / (w.sum(dim=-1, keepdim=True) + 1e-20) * scaling, ids


ROUTER_TOPK_PARTS = ("gemm.dense_wide", "moe.route_topk")


def compose_router_topk(k: dict):
    """``moe.router_topk`` from its parts ``k`` (``ROUTER_TOPK_PARTS``)."""
    logits_of, route = k["gemm.dense_wide"], k["moe.route_topk"]

    def router_topk(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The MoE router of a biased top-k layer: x [T, D] (the normed FFN input), gate_w [E, D] (fp32, or the
        checkpoint's bf16 / fp16: ``gemm.dense_wide`` widens both), bias [E] fp32 -> ``(weights [T, k] fp32, ids
        [T, k] int64)`` = ``moe.route_topk(gemm.dense_wide(x, gate_w), bias, k, scaling)``: fp32 logits. One op so
        a platform may route in the launch that makes the logits; none does now (nvidia's one-launch kernel
        measured even on an H100 and was removed), so every platform composes it from its two parts."""
        return route(logits_of(x, gate_w), bias, top_k, scaling)

    return router_topk


TOPK_EXPERTS_MXFP4_PARTS = ("moe.router_topk", "moe.experts_mxfp4")


def compose_topk_experts_mxfp4(k: dict):
    """``moe.topk_experts_mxfp4`` from its parts ``k`` (``TOPK_EXPERTS_MXFP4_PARTS``)."""
    router, experts = k["moe.router_topk"], k["moe.experts_mxfp4"]

    def topk_experts_mxfp4(x: torch.Tensor, gate_w: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float,
                           w1: torch.Tensor, s1: torch.Tensor, w3: torch.Tensor, s3: torch.Tensor, w2: torch.Tensor,
                           s2: torch.Tensor, limit: float) -> torch.Tensor:
        """A biased top-k layer's routed experts on MXFP4 stacks: x [T, D] (the normed FFN input), the router as
        ``moe.router_topk`` takes it, the six stacks and the SwiGLU limit as ``moe.experts_mxfp4`` takes them ->
        [T, D] in x.dtype = ``moe.experts_mxfp4(x, *moe.router_topk(x, gate_w, bias, k, scaling), ...)``. One op so
        a platform may lay out the routing for its expert kernels in the launch that routes (nvidia does at one
        token: the align launch a layer fewer)."""
        weights, ids = router(x, gate_w, bias, top_k, scaling)
        return experts(x, weights, ids, w1, s1, w3, s3, w2, s2, limit)

    return topk_experts_mxfp4


def route_hash(logits: torch.Tensor, ids: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Hash routing: experts fixed by ``ids [T, k]`` (tid2eid rows); weights as in ``route_topk``."""
    s = sqrtsoftplus(logits)
    ids = ids.long()
    w = s.gather(1, ids)
    return w / (w.sum(dim=-1, keepdim=True) + 1e-20) * scaling, ids


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """``moe.clamped_swiglu``: gate, up [T, F] (any row stride: column slices of one product) -> [T, F] in gate's
    dtype, ``silu(min(gate, L)) * clamp(up, -L, L)``: the silu in fp32 rounded to the dtype, then the product
    rounded once (bf16 * bf16, as torch computes it)."""
    g = gate.clamp(max=limit)
    return F.silu(_up(g)).to(g.dtype) * up.clamp(min=-limit, max=limit)


def _routed(x, weights, ids, expert_weights, limit) -> torch.Tensor:
    """Shared body: ``expert_weights(e) -> (w1 [F, D], w3 [F, D], w2 [D, F])`` for routed experts only."""
    out = torch.zeros(x.shape[0], x.shape[1], dtype=acc(x[:0]).dtype, device=x.device)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w1, w3, w2 = expert_weights(e)
        xe = x[tok]
        h = clamped_swiglu(linear_rows(xe, w1), linear_rows(xe, w3), limit)
        ye = linear_rows(h, w2)
        out.index_add_(0, tok, acc(ye) * acc(weights[tok, slot, None]))
    return out.to(x.dtype)


def experts_dense(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                  w2: torch.Tensor, limit: float) -> torch.Tensor:
    """Routed experts on dense weights.

    x [T, D]; weights [T, k] fp32; ids [T, k]; w1, w3 [E, F, D]; w2 [E, D, F] (cast to x.dtype).
    Returns ``sum_j weights[t,j] * expert_{ids[t,j]}(x_t)`` [T, D] in x.dtype, accumulated in fp32.
    """
    return _routed(x, weights, ids, lambda e: (w1[e], w3[e], w2[e]), limit)


def experts_fp8(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w1: torch.Tensor, s1: torch.Tensor,
                w3: torch.Tensor, s3: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor, block: tuple[int, int],
                limit: float) -> torch.Tensor:
    """Routed experts on FP8 block-scaled weights in the checkpoint layout (only routed experts dequantised).

    w1, w3 [E, F, D] e4m3 with s1, s3 [E, ceil(F/bn), ceil(D/bk)]; w2 [E, D, F] with s2; block (bn, bk).
    """
    def get(e):
        return (dequant_fp8_block(w1[e], s1[e], block), dequant_fp8_block(w3[e], s3[e], block),
                dequant_fp8_block(w2[e], s2[e], block))

    return _routed(x, weights, ids, get, limit)


def experts_mxfp4(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w1: torch.Tensor, s1: torch.Tensor,
                  w3: torch.Tensor, s3: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor, limit: float) -> torch.Tensor:
    """Routed experts on MXFP4 weights in the checkpoint layout (only routed experts dequantised).

    w1, w3 [E, F, D/2] packed e2m1 (uint8) with UE8M0 s1, s3 [E, F, D/32]; w2 [E, D, F/2] with s2 [E, D, F/32].
    A weight stack may also come as ``int32 [E, N, K/8]`` words in the word layout (``mxfp4_words``, what a
    platform's ``moe.experts_mxfp4_layout`` may return): each routed expert is unpacked first.
    """
    def get(e):
        return (dequant_mxfp4(expert_bytes(w1[e]), s1[e]), dequant_mxfp4(expert_bytes(w3[e]), s3[e]),
                dequant_mxfp4(expert_bytes(w2[e]), s2[e]))

    return _routed(x, weights, ids, get, limit)


def _gen_route(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, e, k in [(3, 8, 2), (17, 64, 6)]:
        yield (torch.randn(t, e, generator=g).to(device), torch.randn(e, generator=g).to(device) * 0.1, k, 1.5), {}


def _gen_experts(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, e, k, d, f in [(4, 4, 2, 16, 8), (9, 8, 3, 64, 32)]:
        x = torch.randn(t, d, generator=g).to(dtype).to(device)
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(device)
        w = torch.rand(t, k, generator=g).to(device)
        w1 = (torch.randn(e, f, d, generator=g) / d ** 0.5).to(dtype).to(device)
        w3 = (torch.randn(e, f, d, generator=g) / d ** 0.5).to(dtype).to(device)
        w2 = (torch.randn(e, d, f, generator=g) / f ** 0.5).to(dtype).to(device)
        yield (x, w, ids, w1, w3, w2, 10.0), {}


def _gen_router_topk(dtype, device, seed):
    """Router operands at a few widths (E not a power of two; 1 to 5 rows), x in the test dtype, the router in fp32
    and (3 rows) in bf16 as a checkpoint stores it."""
    g = torch.Generator().manual_seed(seed + 40)
    for t, e, d, k in [(1, 24, 64, 6), (3, 100, 96, 4), (5, 64, 512, 8)]:
        w = torch.randn(e, d, generator=g) / d ** 0.5
        yield ((torch.randn(t, d, generator=g)).to(dtype).to(device), (w.bfloat16() if t == 3 else w).to(device),
               (torch.randn(e, generator=g) * 0.1).to(device), k, 1.5), {}


def _gen_route_hash(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, e, k in [(3, 8, 2), (17, 64, 6)]:
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
        yield (torch.randn(t, e, generator=g).to(device), ids.to(device), 1.5), {}


def _compare_route(out, ref, dtype):
    (wo, io), (wr, ir) = out, ref
    so, oo = io.sort(dim=-1)
    sr, orr = ir.sort(dim=-1)
    assert torch.equal(so, sr), "routed expert sets differ"
    torch.testing.assert_close(wo.gather(1, oo), wr.gather(1, orr), atol=1e-5, rtol=1e-5)


def _gen_experts_fp8(dtype, device, seed):
    for (x, w, ids, w1, w3, w2, limit), _ in _gen_experts(torch.float32, "cpu", seed):
        q = [quant_fp8_block(m, (16, 16)) for t in (w1, w3, w2) for m in t]
        e = w1.shape[0]
        packs = [(torch.stack([q[i * e + j][0] for j in range(e)]), torch.stack([q[i * e + j][1] for j in range(e)]))
                 for i in range(3)]
        yield (x.to(dtype).to(device), w.to(device), ids.to(device), *(t.to(device) for p in packs for t in p),
               (16, 16), limit), {}


def _gen_experts_mxfp4(dtype, device, seed):
    for (x, w, ids, w1, w3, w2, limit), _ in _gen_experts(torch.float32, "cpu", seed):
        if w1.shape[2] % 32 or w2.shape[2] % 32:
            continue  # MXFP4 groups 32 consecutive K elements
        e = w1.shape[0]
        packs = []
        for t in (w1, w3, w2):
            q = [quant_mxfp4(t[j]) for j in range(e)]
            packs.append((torch.stack([a for a, _ in q]), torch.stack([b for _, b in q])))
        args = (x.to(dtype).to(device), w.to(device), ids.to(device), *(t.to(device) for p in packs for t in p),
                limit)
        yield args, {}
        if w1.shape[2] % 8 == 0 and w2.shape[2] % 8 == 0:  # the same experts with the stacks in the word layout
            yield tuple(to_word_layout(a) if i in (3, 5, 7) else a for i, a in enumerate(args)), {}


def _gen_topk_experts_mxfp4(dtype, device, seed):
    """Router operands (x in the test dtype, an fp32 router, a bias) and MXFP4 stacks of E experts: one token (the
    row a platform may route and lay out in one launch) and a few, widths multiples of 32, both stack layouts."""
    g = torch.Generator().manual_seed(seed + 50)
    for t, e, k, d, f in [(1, 16, 6, 64, 32), (1, 24, 4, 128, 64), (3, 16, 6, 64, 32)]:
        x = torch.randn(t, d, generator=g).to(dtype).to(device)
        gate_w = (torch.randn(e, d, generator=g) / d ** 0.5).to(device)
        bias = (torch.randn(e, generator=g) * 0.1).to(device)
        stacks = []
        for n, kk in ((f, d), (f, d), (d, f)):
            q = [quant_mxfp4(torch.randn(n, kk, generator=g) / kk ** 0.5) for _ in range(e)]
            stacks += [torch.stack([a for a, _ in q]).to(device), torch.stack([b for _, b in q]).to(device)]
        yield (x, gate_w, bias, k, 1.5, *stacks, 10.0), {}
        if t == 1:  # the same layer with the stacks in the word layout
            words = [to_word_layout(a) if i % 2 == 0 else a for i, a in enumerate(stacks)]
            yield (x, gate_w, bias, k, 1.5, *words, 10.0), {}


def _gen_experts_layout(dtype, device, seed):
    """The six MXFP4 stacks of ``_gen_experts_mxfp4``'s checkpoint-layout cases."""
    for args, _ in _gen_experts_mxfp4(dtype, device, seed):
        if args[3].dtype == torch.uint8:
            yield args[3:9], {}


def _compare_layout(out, ref, dtype) -> None:
    """``moe.experts_mxfp4_layout``: the same scales, and weight stacks holding the same codes in either layout."""
    assert len(out) == len(ref) == 6, (len(out), len(ref))
    for i, (o, r) in enumerate(zip(out, ref)):
        if i % 2:
            assert torch.equal(o.view(torch.uint8), r.view(torch.uint8)), f"scale stack {i // 2} changed"
        else:
            assert torch.equal(expert_bytes(o), expert_bytes(r)), f"weight stack {i // 2} holds other codes"


def _gen_swiglu(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, f, merged in [(1, 64, False), (3, 2048, True), (5, 96, True), (17, 1536, False)]:
        both = (8 * torch.randn(t, 2 * f, generator=g)).to(dtype).to(device)  # past the limit on both sides
        gate, up = (both[:, :f], both[:, f:]) if merged else (both[:, :f].contiguous(), both[:, f:].contiguous())
        yield (gate, up, 10.0), {}


OPS = [
    OpSpec("moe.clamped_swiglu", clamped_swiglu, _gen_swiglu,
           doc="the shared expert's activation: silu(min(gate, L)) * clamp(up, -L, L)"),
    OpSpec("moe.route_topk", route_topk, _gen_route, compare=_compare_route),
    OpSpec("moe.route_hash", route_hash, _gen_route_hash, compare=_compare_route),
    OpSpec("moe.router_topk", compose_router_topk({"gemm.dense_wide": dense_wide, "moe.route_topk": route_topk}),
           _gen_router_topk, compare=_compare_route, components=ROUTER_TOPK_PARTS, compose=compose_router_topk,
           doc="gemm.dense_wide (the fp32 router logits), then moe.route_topk"),
    OpSpec("moe.experts", experts_dense, _gen_experts, tolerances={torch.bfloat16: (3e-2, 3e-2)}),
    OpSpec("moe.experts_fp8", experts_fp8, _gen_experts_fp8, tolerances={torch.bfloat16: (3e-2, 3e-2)}),
    OpSpec("moe.experts_mxfp4", experts_mxfp4, _gen_experts_mxfp4, tolerances={torch.bfloat16: (3e-2, 3e-2)}),
    OpSpec("moe.topk_experts_mxfp4",
           compose_topk_experts_mxfp4({"moe.router_topk": compose_router_topk(
               {"gemm.dense_wide": dense_wide, "moe.route_topk": route_topk}), "moe.experts_mxfp4": experts_mxfp4}),
           _gen_topk_experts_mxfp4, tolerances={torch.bfloat16: (3e-2, 3e-2)}, components=TOPK_EXPERTS_MXFP4_PARTS,
           compose=compose_topk_experts_mxfp4, doc="moe.router_topk, then moe.experts_mxfp4 on its routing"),
    OpSpec("moe.experts_mxfp4_layout", experts_mxfp4_layout, _gen_experts_layout, compare=_compare_layout,
           doc="the MXFP4 expert stacks as the platform's moe.experts_mxfp4 reads them best (called once at load)"),
]
