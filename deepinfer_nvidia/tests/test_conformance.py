"""Every registered NVIDIA kernel against its reference on the GPU (skipped without one).

Two layers of checks:
- the shared harness (``check_impl``) on each op's own generated cases, fresh
  inputs per seed, per-dtype tolerances;
- model-width cases (head_dim 512, 64 heads, K = 4096, split-K / split-N paths,
  empty rows) with the device allocator poisoned with NaN first, so an output
  element a kernel forgot to write shows up as NaN instead of as stale zeros.
"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

from deepinfer_nvidia.kernels import IMPLS  # noqa: E402  (metadata only, imports no triton)

VENDOR_LIBRARIES = {"flashmla": "flash_mla", "deepgemm": "deep_gemm"}


@pytest.fixture(scope="module")
def reg():
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_nvidia.platform import NvidiaPlatform

    r = get_registry()
    ensure_platform_kernels(r, NvidiaPlatform())
    return r


@pytest.mark.parametrize("op,provider", [(op, prov) for op, prov, *_ in IMPLS])
def test_harness(reg, op, provider):
    from deepinfer_core.testing.conformance import check_impl
    from deepinfer_nvidia.kernels.vendors import importable

    if provider in VENDOR_LIBRARIES:  # test_conformance_vendors.py holds their checks
        if not importable(VENDOR_LIBRARIES[provider]):
            pytest.skip(f"{VENDOR_LIBRARIES[provider]} is not installed: the provider hands every call to triton")
        if provider == "deepgemm":
            pytest.skip("deepgemm computes on FP8 activations: checked against that definition in "
                        "test_conformance_vendors.py, not at the bf16 tolerance")

    assert check_impl(op, provider, "cuda", seeds=(0, 1, 2), registry=reg) > 0


# -- model-width cases with a poisoned allocator ---------------------------------------
def poison() -> None:
    """Fill the caching allocator's free blocks with NaN so fresh ``torch.empty`` outputs start as NaN."""
    torch.cuda.synchronize()
    blobs = [torch.full((64 << 20,), float("nan"), device="cuda") for _ in range(4)]  # 4 x 256 MB
    del blobs
    torch.cuda.synchronize()


def close(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape, out.dtype, ref.dtype)
    o = out.float().cpu()
    assert not torch.isnan(o).any(), "output has NaN: an element was never written"
    torch.testing.assert_close(o, ref.float().cpu(), atol=atol, rtol=rtol)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("t,na,nb,empty_row", [(1, 128, 512, False), (4, 128, 512, True), (64, 128, 0, False),
                                               (200, 128, 64, True), (2, 128, 512, True), (1, 128, 32, False),
                                               (1, 128, 0, True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("provider", ["triton", "triton_bi"])
def test_attention_model_width(reg, t, na, nb, empty_row, dtype, provider):
    from deepinfer_core.kernels.ops.attention import sparse_attention_sink

    fn = reg.impl("attention.sparse_sink", provider)
    for seed in (0, 1):
        g = _gen(seed)
        h, d, sa, sb = 64, 512, 1024, 2048
        q = torch.randn(t, h, d, generator=g).to(dtype)
        kv_a = torch.randn(sa, d, generator=g).to(dtype)
        kv_b = torch.randn(sb, d, generator=g).to(dtype) if nb else None
        idx_a = torch.randint(0, sa, (t, na), generator=g)
        idx_a[:, : na // 3] = -1  # early positions: the window is not full yet
        idx_b = torch.randint(-1, sb, (t, nb), generator=g) if nb else None
        if empty_row:
            idx_a[0] = -1
            if nb:
                idx_b[0] = -1
        sinks = torch.randn(h, generator=g)
        ref = sparse_attention_sink(q, kv_a, idx_a, kv_b, idx_b, sinks, d ** -0.5)
        poison()
        cu = lambda x: None if x is None else x.cuda()  # noqa: E731
        out = fn(q.cuda(), kv_a.cuda(), idx_a.cuda(), cu(kv_b), cu(idx_b), sinks.cuda(), d ** -0.5)
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
        close(out, ref, tol, tol)
        if empty_row:
            assert float(out[0].float().abs().max()) == 0.0


@pytest.mark.parametrize("t", [1, 8, 64, 300, 600])
@pytest.mark.parametrize("fmt,block", [(None, (128, 128)), ("ue8m0", (128, 128)), ("ue8m0", (32, 32))])
@pytest.mark.parametrize("provider", ["triton", "triton_bi"])
def test_fp8_gemm_model_width(reg, t, fmt, block, provider):
    from deepinfer_core.kernels.ops.gemm import fp8_block
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    fn = reg.impl("gemm.fp8_block", provider)
    g = _gen(t)
    n, k = 1536, 4096
    x = torch.randn(t, k, generator=g).bfloat16()
    q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, block, fmt)
    ref = fp8_block(x.float(), q, s, block)  # fp32 product of the same bf16 inputs
    poison()
    close(fn(x.cuda(), q.cuda(), s.cuda(), block), ref.bfloat16(), 3e-2, 3e-2)


@pytest.mark.parametrize("t,n,k", [(1, 1000, 1312), (3, 4096, 1280), (16, 96, 5120), (17, 520, 640),
                                   (64, 2304, 5120), (200, 1000, 1312)])
@pytest.mark.parametrize("knobs", [{}, {"block_k": 256}, {"block_n": 32, "programs": 64},
                                   {"block_k": 64, "block_n": 128}])
@pytest.mark.parametrize("fmt", ["ue8m0", None])
def test_fp8_fine_blocks(t, n, k, knobs, fmt):
    """The fine-scale kernel (K tiles over several [32, 32] scale blocks) against the reference: N and K
    tails (1000 rows, 41 scale blocks of K), forced deep splits, wider and narrower K tiles, fp32 scales."""
    from deepinfer_core.kernels.ops.gemm import fp8_block
    from deepinfer_core.kernels.ops.quant import quant_fp8_block
    from deepinfer_nvidia.kernels import triton_fp8_fine as ff

    g = _gen(7 * t + k)
    x = torch.randn(t, k, generator=g).bfloat16()
    q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, (32, 32), fmt)
    ref = fp8_block(x.float(), q, s, (32, 32))
    poison()
    sb = (s.view(torch.uint8) if fmt else s).contiguous().cuda()
    out = ff.gemm_fp8_fine(x.cuda(), q.cuda(), sb, s.shape[1], 32, 32, fmt is not None, 132, **knobs)
    close(out, ref.bfloat16(), 3e-2, 3e-2)


@pytest.mark.parametrize("t,n,k", [(1, 1000, 1312), (2, 32768, 1280), (4, 520, 5120), (3, 5120, 8192)])
@pytest.mark.parametrize("fmt,block", [("ue8m0", (32, 32)), ("ue8m0", (128, 128)), (None, (128, 128))])
@pytest.mark.parametrize("knobs", [{}, {"block_k": 128, "programs": 64}, {"block_n": 64, "block_k": 512}])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_gemv(t, n, k, fmt, block, knobs, dtype):
    """The few-row CUDA-core GEMV against the reference: N and K tails, 32- and 128-wide scale blocks (several
    per K tile, or one per tile), fp32 scales, forced deep splits, bf16 and fp32 activations."""
    from deepinfer_core.kernels.ops.gemm import fp8_block
    from deepinfer_core.kernels.ops.quant import quant_fp8_block
    from deepinfer_nvidia.kernels import triton_fp8_gemv as gv

    g = _gen(11 * t + k)
    x = torch.randn(t, k, generator=g).to(dtype)
    q, s = quant_fp8_block(torch.randn(n, k, generator=g) / k ** 0.5, block, fmt)
    ref = fp8_block(x.float(), q, s, block)
    poison()
    sb = (s.view(torch.uint8) if fmt else s).contiguous().cuda()
    out = gv.gemm_fp8_gemv(x.cuda(), q.cuda(), sb, s.shape[1], block[0], block[1], fmt is not None, 132, **knobs)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    close(out, ref.to(dtype), tol, tol)


@pytest.mark.parametrize("t", [1, 8, 64, 300, 600])
@pytest.mark.parametrize("fmt,block", [("ue8m0", (32, 32)), ("ue8m0", (128, 128)), (None, (128, 128))])
@pytest.mark.parametrize("provider", ["triton", "triton_bi"])
def test_fp8_grouped_model_width(reg, t, fmt, block, provider):
    """``gemm.fp8_block_grouped`` at the V4.1 ``wo_a`` width (8 groups of 1024 x 4096) against the reference,
    through the fine kernel (32x32), the general kernel (128x128), the dequant + bmm path (600 rows) and the
    batch-invariant launch; the batch-invariant one must equal the per-group batch-invariant GEMMs bit for bit."""
    from deepinfer_core.kernels.ops.gemm import fp8_block_grouped
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    fn = reg.impl("gemm.fp8_block_grouped", provider)
    g = _gen(300 + t)
    groups, ng, kg = 8, 1024, 4096
    x = torch.randn(t, groups * kg, generator=g).bfloat16()
    q, s = quant_fp8_block(torch.randn(groups * ng, kg, generator=g) / kg ** 0.5, block, fmt)
    ref = fp8_block_grouped(x.float(), q, s, block, groups)
    poison()
    xc, qc, sc = x.cuda(), q.cuda(), s.cuda()
    out = fn(xc, qc, sc, block, groups)
    close(out, ref.bfloat16(), 3e-2, 3e-2)
    if provider == "triton_bi":
        one = reg.impl("gemm.fp8_block", "triton_bi")
        sb = ng // block[0]
        loop = torch.cat([one(xc[:, i * kg:(i + 1) * kg], qc[i * ng:(i + 1) * ng], sc[i * sb:(i + 1) * sb], block)
                          for i in range(groups)], dim=-1)
        assert torch.equal(out, loop)


def test_fp8_grouped_bad_input(reg):
    """Groups that do not divide the weight rows, or rows per group off the scale block: the reference's error."""
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    q, s = quant_fp8_block(torch.randn(96, 64), (32, 32), "ue8m0")
    fn = reg.impl("gemm.fp8_block_grouped", "triton")
    x = torch.randn(2, 4 * 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="groups"):
        fn(x[:, :5 * 64], q.cuda(), s.cuda(), (32, 32), 5)
    with pytest.raises(ValueError, match="multiple of the scale block"):
        fn(x, q.cuda(), s.cuda(), (32, 32), 4)  # 24 rows per group


@pytest.mark.parametrize("t", [1, 64, 300])
@pytest.mark.parametrize("provider", ["triton", "triton_bi"])
def test_mxfp4_gemm_model_width(reg, t, provider):
    from deepinfer_core.kernels.ops.gemm import mxfp4
    from deepinfer_core.kernels.ops.quant import quant_mxfp4

    fn = reg.impl("gemm.mxfp4", provider)
    g = _gen(100 + t)
    n, k = 2048, 4096
    x = torch.randn(t, k, generator=g).bfloat16()
    packed, s = quant_mxfp4(torch.randn(n, k, generator=g) / k ** 0.5)
    ref = mxfp4(x.float(), packed, s)
    poison()
    close(fn(x.cuda(), packed.cuda(), s.cuda()), ref.bfloat16(), 3e-2, 3e-2)


@pytest.mark.parametrize("t", [1, 8, 64, 513, 2048])
@pytest.mark.parametrize("d", [4096, 5120])
@pytest.mark.parametrize("provider", ["triton", "triton_bi"])
def test_mhc_mix_model_width(reg, t, d, provider):
    """V4 and V4.1 widths (n*D = 16384 / 20480: up to 64 K splits at decode sizes; 2048 tokens take the
    default launch's tf32x3 projection)."""
    from deepinfer_core.kernels.ops.mhc import mhc_mix

    fn = reg.impl("mhc.mix", provider)
    g = _gen(200 + t)
    n = 4
    r = torch.randn(t, n, d, generator=g).bfloat16()
    fnw = torch.randn((2 + n) * n, n * d, generator=g) / (n * d) ** 0.5
    base = torch.randn((2 + n) * n, generator=g)
    scale = torch.rand(3, generator=g) + 0.5
    ref = mhc_mix(r, fnw, base, scale, 1e-6, 1e-6, 20)
    poison()
    out = fn(r.cuda(), fnw.cuda(), base.cuda(), scale.cuda(), 1e-6, 1e-6, 20)
    for o, rr in zip(out, ref):
        close(o, rr, 1e-4, 1e-4)


@pytest.mark.parametrize("t", [1, 64, 513])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mhc_collapse_expand_model_width(reg, t, dtype):
    from deepinfer_core.kernels.ops.mhc import mhc_collapse, mhc_collapse_norm, mhc_expand

    g = _gen(250 + t)
    n, d = 4, 4096
    r = torch.randn(t, n, d, generator=g).to(dtype)
    y = torch.randn(t, d, generator=g).to(dtype)
    pre = torch.rand(t, n, generator=g)
    post = 2 * torch.rand(t, n, generator=g)
    comb = torch.rand(t, n, n, generator=g)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    poison()
    close(reg.impl("mhc.collapse", "triton")(r.cuda(), pre.cuda()), mhc_collapse(r, pre), tol, tol)
    poison()
    close(reg.impl("mhc.expand", "triton")(r.cuda(), y.cuda(), post.cuda(), comb.cuda()),
          mhc_expand(r, y, post, comb), tol, tol)
    norm_w = 1 + 0.1 * torch.randn(d, generator=g)
    poison()
    close(reg.impl("mhc.collapse_norm", "triton")(r.cuda(), pre.cuda(), norm_w.cuda(), 1e-6),
          mhc_collapse_norm(r, pre, norm_w, 1e-6), tol, tol)
    y2 = torch.randn(t, d, generator=g).to(dtype)  # the MoE's shared output beside the routed one
    poison()
    close(reg.impl("mhc.expand", "triton")(r.cuda(), (y.cuda(), y2.cuda()), post.cuda(), comb.cuda()),
          mhc_expand(r, (y, y2), post, comb), tol, tol)


@pytest.mark.parametrize("t,n,prefill", [(1, 2048, False), (64, 1024, False), (300, 96, False), (1030, 300, True),
                                         (1, 1024, False), (2, 1000, False), (16, 1024, False)])
def test_index_scores_model_width(reg, t, n, prefill):
    """Random candidates (from 256 tokens: the tiled kernel's token-by-token chunks) and a prefill's (two
    sequences, each token a prefix of its sequence's slot list: shared key tiles, skipped chunks)."""
    from deepinfer_core.kernels.ops.indexer import indexer_scores

    fn = reg.impl("index.scores", "triton")
    g = _gen(300 + t)
    h, d, s = 64, 128, 4096
    q = torch.randn(t, h, d, generator=g).bfloat16()
    w = torch.randn(t, h, generator=g)
    keys = torch.randn(s, d, generator=g).bfloat16()
    cand = torch.randint(-1, s, (t, n), generator=g)
    if prefill:
        from deepinfer_nvidia.tests.bench_indexer import causal_cand

        cand = causal_cand([t // 2 + 3, t - t // 2 - 3], 2, s, g)[:, :n]
    ref = indexer_scores(q, w, keys, cand, d ** -0.5)
    poison()
    out = fn(q.cuda(), w.cuda(), keys.cuda(), cand.cuda(), d ** -0.5)
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out.cpu()), fin)
    close(torch.where(fin.cuda(), out, 0.0), torch.where(fin, ref, 0.0), 5e-2, 5e-2)


def test_rope_and_norm_model_width(reg):
    from deepinfer_core.kernels.ops.norm import rms_norm, rms_norm_unweighted
    from deepinfer_core.kernels.ops.rope import apply_rope, yarn_inv_freq

    g = _gen(7)
    x = torch.randn(64, 64, 512, generator=g).bfloat16()
    pos = torch.randint(0, 1_000_000, (64,), generator=g)
    f = yarn_inv_freq(64, 160000.0, 16.0, 65536)
    poison()
    for inverse in (False, True):
        close(reg.impl("rope.interleaved", "triton")(x.cuda(), pos.cuda(), f.cuda(), inverse=inverse),
              apply_rope(x, pos, f, inverse=inverse), 3e-2, 3e-2)
    xf = torch.randn(33, 4096, generator=g)
    close(reg.impl("rope.interleaved", "triton")(xf.view(33, 8, 512).cuda(), pos[:33].cuda(), f.cuda()),
          apply_rope(xf.view(33, 8, 512), pos[:33], f), 1e-4, 1e-4)
    w = 1 + 0.1 * torch.randn(4096, generator=g)
    close(reg.impl("norm.rms", "triton")(xf.bfloat16().cuda(), w.cuda(), 1e-6), rms_norm(xf.bfloat16(), w, 1e-6),
          2e-2, 2e-2)
    close(reg.impl("norm.rms_unweighted", "triton")(x.cuda(), 1e-6), rms_norm_unweighted(x, 1e-6), 2e-2, 2e-2)


@pytest.mark.parametrize("t", [1, 64, 257])
def test_moe_experts_grouped(reg, t):
    from deepinfer_core.kernels.ops.moe import experts_dense

    fn = reg.impl("moe.experts", "aten")
    g = _gen(400 + t)
    e, k, d, f = 32, 6, 512, 256
    x = torch.randn(t, d, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    w = torch.rand(t, k, generator=g)
    w1 = (torch.randn(e, f, d, generator=g) / d ** 0.5).bfloat16()
    w3 = (torch.randn(e, f, d, generator=g) / d ** 0.5).bfloat16()
    w2 = (torch.randn(e, d, f, generator=g) / f ** 0.5).bfloat16()
    ref = experts_dense(x, w, ids, w1, w3, w2, 10.0)
    out = fn(x.cuda(), w.cuda(), ids.cuda(), w1.cuda(), w3.cuda(), w2.cuda(), 10.0)
    close(out, ref, 3e-2, 3e-2)


@pytest.mark.parametrize("t,skew", [(1, False), (5, False), (64, False), (300, False), (300, True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("provider", ["triton", "triton_bi"])
def test_moe_experts_mxfp4_grouped(reg, t, skew, dtype, provider):
    """The one-pass grouped MXFP4 experts against the reference (routed experts dequantised in fp32 on
    the CPU). ``skew``: every token routes to the same 6 experts, so one expert fills many blocks."""
    from deepinfer_core.kernels.ops.moe import experts_mxfp4
    from deepinfer_core.kernels.ops.quant import quant_mxfp4

    fn = reg.impl("moe.experts_mxfp4", provider)
    g = _gen(500 + t)
    e, k, d, f = 16, 6, 1024, 512

    def stack(n, kk):
        q = [quant_mxfp4(torch.randn(n, kk, generator=g) / kk ** 0.5) for _ in range(e)]
        return torch.stack([a for a, _ in q]), torch.stack([b for _, b in q])

    w1, s1 = stack(f, d)
    w3, s3 = stack(f, d)
    w2, s2 = stack(d, f)
    x = torch.randn(t, d, generator=g).to(dtype)
    if skew:
        ids = torch.randperm(e, generator=g)[:k].expand(t, k).contiguous()
    else:
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    w = torch.rand(t, k, generator=g)
    ref = experts_mxfp4(x, w, ids, w1, s1, w3, s3, w2, s2, 1.0)  # limit 1.0: the clamps are active
    poison()
    cu = [a.cuda() for a in (x, w, ids, w1, s1, w3, s3, w2, s2)]
    out = fn(*cu, 1.0)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    close(out, ref, tol, tol)


_MXFP4_STACKS: dict = {}


def _mxfp4_stacks(e: int, d: int, f: int, seed: int):
    """Random MXFP4 expert stacks (w1, s1, w3, s3, w2, s2) on the CPU, cached per shape."""
    from deepinfer_core.kernels.ops.quant import quant_mxfp4

    key = (e, d, f, seed)
    if key not in _MXFP4_STACKS:
        g = _gen(seed)

        def stack(n, kk):
            q = [quant_mxfp4(torch.randn(n, kk, generator=g) / kk ** 0.5) for _ in range(e)]
            return [torch.stack([a for a, _ in q]), torch.stack([b for _, b in q])]

        _MXFP4_STACKS[key] = stack(f, d) + stack(f, d) + stack(d, f)
    return _MXFP4_STACKS[key]


def _routing(t: int, k: int, e: int, route: str, g: torch.Generator):
    """(ids [t, k], weights [t, k]): ``one`` puts every pair on the last expert, ``skew`` gives every token the same
    k experts, else each token k distinct random experts."""
    if route == "one":
        ids = torch.full((t, k), e - 1, dtype=torch.long)
    elif route == "skew":
        ids = torch.randperm(e, generator=g)[:k].expand(t, k).contiguous()
    else:
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    return ids, torch.rand(t, k, generator=g)


def _mxfp4_case(seed: int, t: int, k: int, route: str, dtype: torch.dtype):
    """One routed-expert case at D=640, F=288 (K tiles with tails), 16 experts: the CPU reference output (limit
    1.0: the clamps are active) and the operands on the GPU (x, weights, ids, the six stacks)."""
    from deepinfer_core.kernels.ops.moe import experts_mxfp4

    e, d, f = 16, 640, 288
    ws = _mxfp4_stacks(e, d, f, 600)
    g = _gen(seed)
    x = torch.randn(t, d, generator=g).to(dtype)
    ids, w = _routing(t, k, e, route, g)
    return experts_mxfp4(x, w, ids, *ws, 1.0), [a.cuda() for a in [x, w, ids] + ws]


@pytest.mark.parametrize("t,k,route", [(1, 6, "rand"), (8, 6, "one"), (17, 3, "skew"), (64, 6, "rand"),
                                       (100, 6, "rand"), (5, 8, "one")])
@pytest.mark.parametrize("r", [2, 4])
@pytest.mark.parametrize("programs", [0, 1 << 20])
def test_moe_experts_mxfp4_segments(t, k, route, r, programs):
    """The segment path (one weight decode for up to R pairs of one expert) against the reference: runs longer
    than R on one expert (``one``: every pair on the last expert, 40 pairs; ``skew``: 17 pairs on each of 3),
    random routing, the deepest K split (partials + reductions) and one split. bf16, D=640, F=288."""
    from deepinfer_nvidia.kernels import triton_moe_segments as sg

    ref, cu = _mxfp4_case(900 + t * 10 + k, t, k, route, torch.bfloat16)
    poison()
    out = sg.segments_mxfp4(*cu, 1.0, pairs_per_program=r, programs=programs or 2048)
    close(out, ref, 3e-2, 3e-2)


@pytest.mark.parametrize("t,k,route", [(1, 6, "rand"), (1, 1, "rand"), (1, 8, "one"), (2, 4, "rand"),
                                       (8, 6, "rand"), (8, 6, "one"), (17, 3, "skew"), (64, 6, "rand")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("programs,asm", [(0, None), (1 << 20, 1), (1 << 20, 0)])
def test_moe_experts_mxfp4_splitk(reg, t, k, route, dtype, programs, asm):
    """The split-K decode path against the reference: T=1 and small T, several k, routing where every pair
    hits one expert (the last, also twice per token) or one fixed set; ``programs`` 0: through the provider
    (the path it picks at these pair counts), 1<<20: forced to the deepest K split (partials + reductions),
    with the inline-PTX and the plain-Triton nibble decode.
    D=640, F=288: K tiles with tails (20 and 9 groups of 32)."""
    from deepinfer_nvidia.kernels import triton_moe_splitk as sk

    ref, cu = _mxfp4_case(700 + t * 10 + k, t, k, route, dtype)
    poison()
    if programs or t * k > sk.SPLITK_PAIRS:
        out = sk.splitk_mxfp4(*cu, 1.0, programs=programs or None, asm=asm)
    else:
        out = reg.impl("moe.experts_mxfp4", "triton")(*cu, 1.0)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    close(out, ref, tol, tol)


@pytest.mark.parametrize("t,k,route,bm,bk", [(1, 6, "rand", 16, 256), (8, 6, "one", 16, 128), (17, 3, "skew", 32, 256),
                                             (64, 6, "rand", 16, 128), (300, 6, "rand", 64, 128),
                                             (300, 6, "skew", 128, 128), (700, 6, "rand", 128, 64),
                                             (64, 6, "rand", 0, 0)])
def test_moe_experts_mxfp4_scaled(reg, t, k, route, bm, bk):
    """The ``tl.dot_scaled`` grouped path against the reference, bf16: one row to prefill-sized blocks, routing
    that puts every pair on one expert (one expert then fills several blocks) or one fixed set; BLOCK_M 16-128,
    K tiles 64-256 with tails (D=640, F=288); ``bm`` 0: the module's own tile choice."""
    from deepinfer_nvidia.kernels import triton_moe_scaled as sc

    ref, cu = _mxfp4_case(1100 + t * 10 + k, t, k, route, torch.bfloat16)
    poison()
    out = sc.scaled_mxfp4(*cu, 1.0, block_m=bm or None, block_k=bk or None)
    close(out, ref, 3e-2, 3e-2)


def test_moe_experts_mxfp4_dequant_once(reg):
    """The prefill path (experts dequantised to bf16 in chunks, grouped GEMMs) against the reference,
    with chunks that split the experts unevenly; and the stack dequantiser bit-exact."""
    from deepinfer_core.kernels.ops.moe import experts_mxfp4
    from deepinfer_core.kernels.ops.quant import dequant_mxfp4, quant_mxfp4
    from deepinfer_nvidia.kernels.triton_moe import dequant_mxfp4_stack, dequant_once_mxfp4

    g = _gen(88)
    e, k, d, f, t = 40, 6, 512, 256, 700

    def stack(n, kk):
        q = [quant_mxfp4(torch.randn(n, kk, generator=g) / kk ** 0.5) for _ in range(e)]
        return torch.stack([a for a, _ in q]), torch.stack([b for _, b in q])

    w1, s1 = stack(f, d)
    w3, s3 = stack(f, d)
    w2, s2 = stack(d, f)
    ref_w = torch.stack([dequant_mxfp4(w1[i], s1[i]) for i in range(e)])
    poison()
    assert torch.equal(dequant_mxfp4_stack(w1.cuda(), s1.cuda(), torch.float32).cpu(), ref_w)
    x = torch.randn(t, d, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    ids[: t // 2, 0] = e - 1  # one heavy expert in the last (partial) chunk
    w = torch.rand(t, k, generator=g)
    ref = experts_mxfp4(x, w, ids, w1, s1, w3, s3, w2, s2, 1.0)
    cu = [a.cuda() for a in (x, w, ids, w1, s1, w3, s3, w2, s2)]
    for chunk in (32, 7):
        poison()
        close(dequant_once_mxfp4(*cu, 1.0, chunk=chunk), ref, 3e-2, 3e-2)


def test_moe_experts_mxfp4_graph_capture(reg):
    """The grouped path has no host sync: it captures into a CUDA graph and replays with new routing."""
    from deepinfer_core.kernels.ops.moe import experts_mxfp4
    from deepinfer_core.kernels.ops.quant import quant_mxfp4
    from deepinfer_nvidia.graphs import CudaGraphRunner

    fn = reg.impl("moe.experts_mxfp4", "triton")
    g = _gen(77)
    e, k, d, f, t = 8, 2, 256, 128, 12

    def stack(n, kk):
        q = [quant_mxfp4(torch.randn(n, kk, generator=g) / kk ** 0.5) for _ in range(e)]
        return [torch.stack([a for a, _ in q]).cuda(), torch.stack([b for _, b in q]).cuda()]

    ws = stack(f, d) + stack(f, d) + stack(d, f)
    runner = CudaGraphRunner(lambda x, w, ids: fn(x, w, ids, *ws, 10.0))
    for step in range(3):
        x = torch.randn(t, d, generator=g).bfloat16()
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
        w = torch.rand(t, k, generator=g)
        out = runner(x.cuda(), w.cuda(), ids.cuda())
        ref = experts_mxfp4(x, w, ids, *[a.cpu() for a in ws], 10.0)
        close(out, ref, 3e-2, 3e-2)
    assert runner.num_graphs == 1


def test_contract_violations_raise(reg):
    """Bad operands raise named errors; they are never handed to a fallback."""
    from deepinfer_core.kernels.ops.quant import QuantFormatError

    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    q = torch.zeros(128, 256, device="cuda").to(torch.float8_e4m3fn)
    with pytest.raises(QuantFormatError, match="must have shape"):
        reg.impl("gemm.fp8_block", "triton")(x, q, torch.ones(3, 3, device="cuda"), (128, 128))
    with pytest.raises(ValueError, match="K=256"):
        reg.impl("gemm.fp8_block", "triton")(x[:, :128], q, torch.ones(1, 2, device="cuda"), (128, 128))
    with pytest.raises(ValueError, match="sinks"):
        qq = torch.randn(2, 4, 64, device="cuda")
        reg.impl("attention.sparse_sink", "triton")(qq, torch.randn(8, 64, device="cuda"),
                                                    torch.zeros(2, 3, dtype=torch.long, device="cuda"), None, None,
                                                    torch.zeros(5, device="cuda"), 0.1)


@pytest.mark.parametrize("t,k,e", [(1, 6, 384), (8, 6, 384), (64, 6, 384), (170, 6, 256), (40, 3, 3), (256, 6, 384)])
@pytest.mark.parametrize("bm", [16, 64])
def test_moe_align_one_launch(t, k, e, bm):
    """``align`` on the GPU (one launch up to ``ALIGN_MAX_PAIRS``) equals its torch form (run on the CPU), also
    when every pair sits on one expert; captured in a CUDA graph and replayed on new routing."""
    from deepinfer_nvidia.kernels import triton_moe as tm

    g = _gen(1500 + t + k + e + bm)
    for route in ("rand", "one"):
        ids = torch.rand(t, e, generator=g).topk(k, dim=1).indices if route == "rand" else \
            torch.full((t, k), e - 1, dtype=torch.long)
        ref = tm.align(ids, e, bm)
        out = tm.align(ids.cuda(), e, bm)
        assert torch.equal(out[0].cpu(), ref[0]) and torch.equal(out[1].cpu(), ref[1])
    ids = torch.rand(t, e, generator=g).topk(k, dim=1).indices.cuda()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cap = tm.align(ids, e, bm)
    ids.copy_(torch.rand(t, e, generator=g).topk(k, dim=1).indices.cuda())
    graph.replay()
    ref = tm.align(ids.cpu(), e, bm)
    assert torch.equal(cap[0].cpu(), ref[0]) and torch.equal(cap[1].cpu(), ref[1])
