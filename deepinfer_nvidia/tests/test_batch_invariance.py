"""Batch invariance of every kernel registered ``batch_invariant=True`` (skipped without a GPU).

    python3 -m pytest -q deepinfer_nvidia/tests/test_batch_invariance.py

Row checks: one fixed target row (a token: its activations, its slot / candidate lists, its routing)
is computed alone (M = 1) and inside calls of M = 2, 7, 64 and 1000 rows whose other rows are fresh
random data, at a different position each time; its output must be bitwise identical (compared as
raw bits, so -0.0 vs 0.0 or NaN payloads would show). Lists that the step metadata pads to the
longest row of the step (compressed slots, indexer candidates) are padded with -1 to that batch's
width, as ``deepinfer_core/runner/context.py`` does. Conformance: the ``triton_bi`` launches against
the references at model widths (the shared harness covers the ops' own small cases through
``test_conformance.py``, which is parametrised over every IMPLS entry).
"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

from deepinfer_nvidia.kernels import IMPLS  # noqa: E402  (metadata only, imports no triton)

SIZES = (2, 7, 64, 1000)
INVARIANT = sorted({(op, prov) for op, prov, _target, _supports, *flag in IMPLS if flag and flag[0]})


@pytest.fixture(scope="module")
def reg():
    from deepinfer_core.kernels.registry import get_registry
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_nvidia.platform import NvidiaPlatform

    r = get_registry()
    ensure_platform_kernels(r, NvidiaPlatform())
    return r


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor (so equality is bitwise, NaN == NaN of the same payload)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def rows_equal(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return all(rows_equal(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def check_rows(run, make_row, sizes=SIZES) -> None:
    """``make_row(g)`` -> one row's inputs (a tuple of tensors / lists); ``run(rows)`` -> per-row outputs.

    The target row alone must equal, bit for bit, the same row inside every batch of ``sizes``."""
    g = torch.Generator().manual_seed(1234)
    target = make_row(g)
    alone = run([target])[0]
    for m in sizes:
        gm = torch.Generator().manual_seed(m)
        others = [make_row(gm) for _ in range(m - 1)]
        pos = (m * 5 // 7) % m  # the target sits at a different place in each batch
        out = run(others[:pos] + [target] + others[pos:])[pos]
        assert rows_equal(out, alone), f"row differs inside a batch of {m} (position {pos})"


def pad_lists(lists: list[torch.Tensor], extra: int) -> torch.Tensor:
    """[-1 padded] int64 [M, max len + extra] on the GPU: valid entries first, as the step metadata lays them."""
    width = max(len(x) for x in lists) + extra
    out = torch.full((len(lists), width), -1, dtype=torch.long)
    for i, x in enumerate(lists):
        out[i, :len(x)] = x
    return out.cuda()


DTYPES = [torch.bfloat16, torch.float32]


# -- GEMMs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt,block", [(None, (128, 128)), ("ue8m0", (128, 128))])
def test_fp8_gemm_rows(reg, dtype, fmt, block):
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    g = torch.Generator().manual_seed(1)
    q, s = quant_fp8_block(torch.randn(1536, 4096, generator=g) / 64, block, fmt)
    q, s = q.cuda(), s.cuda()
    fn = reg.impl("gemm.fp8_block", "triton_bi")
    check_rows(lambda rows: fn(torch.stack(rows).cuda().to(dtype), q, s, block),
               lambda g: torch.randn(4096, generator=g))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt,block", [("ue8m0", (32, 32)), ("ue8m0", (128, 128))])
def test_fp8_grouped_gemm_rows(reg, dtype, fmt, block):
    """The grouped output projection (8 groups of 1024 x 4096, V4.1's wo_a), batch-invariant launch."""
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    g = torch.Generator().manual_seed(3)
    q, s = quant_fp8_block(torch.randn(8 * 1024, 4096, generator=g) / 64, block, fmt)
    q, s = q.cuda(), s.cuda()
    fn = reg.impl("gemm.fp8_block_grouped", "triton_bi")
    check_rows(lambda rows: fn(torch.stack(rows).cuda().to(dtype), q, s, block, 8),
               lambda g: torch.randn(8 * 4096, generator=g))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_gemm_rows(reg, dtype):
    from deepinfer_core.kernels.ops.quant import quant_mxfp4

    g = torch.Generator().manual_seed(2)
    p, s = (a.cuda() for a in quant_mxfp4(torch.randn(2048, 4096, generator=g) / 64))
    fn = reg.impl("gemm.mxfp4", "triton_bi")
    check_rows(lambda rows: fn(torch.stack(rows).cuda().to(dtype), p, s), lambda g: torch.randn(4096, generator=g))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float32])
def test_dense_gemm_rows(reg, dtype, wdtype):
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(4000, 4096, generator=g) / 64).to(wdtype).cuda()  # N not a tile multiple
    fn = reg.impl("gemm.dense", "triton_bi")
    check_rows(lambda rows: fn(torch.stack(rows).cuda().to(dtype), w), lambda g: torch.randn(4096, generator=g))


def test_dense_wide_gemm_rows(reg):
    """gemm.dense_wide[triton_bi]: bf16 rows widened to an fp32 router-like weight."""
    g = torch.Generator().manual_seed(4)
    w = (torch.randn(384, 5120, generator=g) / 70).cuda()
    fn = reg.impl("gemm.dense_wide", "triton_bi")
    check_rows(lambda rows: fn(torch.stack(rows).cuda().bfloat16(), w), lambda g: torch.randn(5120, generator=g))


@pytest.mark.parametrize("t", [1, 8, 64, 600])
@pytest.mark.parametrize("dtype,wdtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                          (torch.bfloat16, torch.float32)])
def test_dense_gemm_conformance(reg, t, dtype, wdtype):
    """gemm.dense[triton_bi] against the reference (w cast to x.dtype, fp32 accumulation), NaN-poisoned outputs."""
    from deepinfer_core.kernels.ops.gemm import dense
    from deepinfer_nvidia.tests.test_conformance import close, poison

    g = torch.Generator().manual_seed(10 + t)
    x = torch.randn(t, 4096, generator=g).to(dtype)
    w = (torch.randn(3000, 4096, generator=g) / 64).to(wdtype)
    ref = dense(x.float(), w.to(dtype).float()).to(dtype)  # fp32 product of the same rounded operands
    poison()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    close(reg.impl("gemm.dense", "triton_bi")(x.cuda(), w.cuda()), ref, tol, tol)


# -- attention and indexer ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_rows(reg, dtype):
    h, d, w, sa, sb = 64, 512, 128, 2048, 4096
    g0 = torch.Generator().manual_seed(4)
    kv_a = torch.randn(sa, d, generator=g0).to(dtype).cuda()
    kv_b = torch.randn(sb, d, generator=g0).to(dtype).cuda()
    sinks = torch.randn(h, generator=g0).cuda()
    fn = reg.impl("attention.sparse_sink", "triton_bi")

    def make_row(g):
        q = torch.randn(h, d, generator=g)
        win = torch.randint(0, sa, (w,), generator=g)
        win[: int(torch.randint(0, w, (1,), generator=g))] = -1  # early positions: the window is not full
        nb = int(torch.randint(0, 700, (1,), generator=g))
        return q, win, torch.randint(0, sb, (nb,), generator=g)

    def run(rows):
        q = torch.stack([r[0] for r in rows]).to(dtype).cuda()
        ia = torch.stack([r[1] for r in rows]).cuda()
        ib = pad_lists([r[2] for r in rows], extra=37 if len(rows) > 1 else 0)
        return fn(q, kv_a, ia, kv_b, ib, sinks, d ** -0.5)

    check_rows(run, make_row)


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_scores_rows(reg, dtype):
    h, d, s = 64, 128, 4096
    keys = torch.randn(s, d, generator=torch.Generator().manual_seed(5)).to(dtype).cuda()
    fn = reg.impl("index.scores", "triton_bi")

    def make_row(g):
        return (torch.randn(h, d, generator=g), torch.randn(h, generator=g),
                torch.randint(0, s, (int(torch.randint(1, 1100, (1,), generator=g)),), generator=g))

    def run(rows):
        cand = pad_lists([r[2] for r in rows], extra=19 if len(rows) > 1 else 0)
        # the weights in q's dtype, as the models pass weights_proj's output (its scale folded into score_scale)
        out = fn(torch.stack([r[0] for r in rows]).to(dtype).cuda(), torch.stack([r[1] for r in rows]).to(dtype).cuda(),
                 keys, cand, d ** -0.5 * h ** -0.5)
        return [o[:len(r[2])] for o, r in zip(out, rows)]  # the row's own candidates

    check_rows(run, make_row)


# -- mHC --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_mhc_rows(reg, dtype):
    n, d = 4, 4096
    g0 = torch.Generator().manual_seed(6)
    fnw = (torch.randn((2 + n) * n, n * d, generator=g0) / (n * d) ** 0.5).cuda()
    base = torch.randn((2 + n) * n, generator=g0).cuda()
    scale = (torch.rand(3, generator=g0) + 0.5).cuda()
    mix = reg.impl("mhc.mix", "triton_bi")
    collapse, expand = reg.impl("mhc.collapse", "triton"), reg.impl("mhc.expand", "triton")

    def stack(rows, i):
        return torch.stack([r[i] for r in rows]).cuda()

    def run_mix(rows):
        pre, post, comb = mix(stack(rows, 0).to(dtype), fnw, base, scale, 1e-6, 1e-6, 20)
        return list(zip(pre, post, comb))

    check_rows(run_mix, lambda g: (torch.randn(n, d, generator=g),))
    row = lambda g: (torch.randn(n, d, generator=g), torch.rand(n, generator=g), torch.randn(d, generator=g),  # noqa
                     2 * torch.rand(n, generator=g), torch.rand(n, n, generator=g))
    check_rows(lambda rows: collapse(stack(rows, 0).to(dtype), stack(rows, 1)), row)
    check_rows(lambda rows: expand(stack(rows, 0).to(dtype), stack(rows, 2).to(dtype), stack(rows, 3),
                                   stack(rows, 4)), row)
    collapse_norm = reg.impl("mhc.collapse_norm", "triton")
    norm_w = (1 + 0.1 * torch.randn(d, generator=g0)).cuda()
    check_rows(lambda rows: collapse_norm(stack(rows, 0).to(dtype), stack(rows, 1), norm_w, 1e-6), row)
    head = reg.impl("mhc.head_pre", "triton")
    hfn = (torch.randn(n, n * d, generator=g0) / (n * d) ** 0.5).cuda()
    hbase, hscale = torch.randn(n, generator=g0).cuda(), (torch.rand(1, generator=g0) + 0.5).cuda()
    check_rows(lambda rows: head(stack(rows, 0).to(dtype), hfn, hbase, hscale, 1e-6, 1e-6),
               lambda g: (torch.randn(n, d, generator=g),))


# -- norms and rope (registered invariant since the first GPU pass) ---------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_rope_rows(reg, dtype):
    from deepinfer_core.kernels.ops.rope import yarn_inv_freq

    w = (1 + 0.1 * torch.randn(4096, generator=torch.Generator().manual_seed(7))).cuda()
    f = yarn_inv_freq(64, 160000.0, 16.0, 65536).cuda()
    rms, unw, rope = (reg.impl(op, "triton") for op in ("norm.rms", "norm.rms_unweighted", "rope.interleaved"))
    check_rows(lambda rows: rms(torch.stack(rows).to(dtype).cuda(), w, 1e-6), lambda g: torch.randn(4096, generator=g))
    check_rows(lambda rows: unw(torch.stack(rows).to(dtype).cuda(), 1e-6), lambda g: torch.randn(8, 512, generator=g))
    check_rows(lambda rows: rope(torch.stack([r[0] for r in rows]).to(dtype).cuda(),
                                 torch.stack([r[1] for r in rows]).cuda(), f),
               lambda g: (torch.randn(8, 512, generator=g), torch.randint(0, 10 ** 6, (), generator=g)))


# -- Engram -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_engram_rows(reg, dtype):
    """engram.gather (one token's 24 FP8 rows) and engram.gate (4 streams of 4096 with their keys and value)."""
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    table, scale = quant_fp8_block(torch.randn(3000, 256, generator=torch.Generator().manual_seed(9)), (1, 32),
                                   "ue8m0")
    table, scale = table.cuda(), scale.cuda()
    gather, gate = reg.impl("engram.gather", "triton"), reg.impl("engram.gate", "triton")
    check_rows(lambda rows: gather(table, scale, torch.stack(rows).cuda(), dtype),
               lambda g: torch.randint(0, 3000, (24,), generator=g))
    qk = 1 + 0.1 * torch.randn(2, 4, 4096, generator=torch.Generator().manual_seed(10))
    qw, kw = qk[0].cuda(), qk[1].cuda()
    check_rows(lambda rows: gate(torch.stack([r[0] for r in rows]).to(dtype).cuda(),
                                 torch.stack([r[1] for r in rows]).to(dtype).cuda(), qw, kw, 1e-6, 1e-6),
               lambda g: (torch.randn(4, 4096, generator=g), torch.randn(5 * 4096, generator=g)))



def test_engram_hash_rows(reg):
    """engram.hash_ids: one token's 24 hash ids (V4.1's primes and multipliers) equal in any batch."""
    from deepinfer_models.deepseek_v41.engram_hash import engram_multipliers, engram_offsets, engram_primes

    primes = engram_primes(2, 4, 8, 1_000_000)
    p, o = torch.tensor(primes).cuda(), torch.tensor(engram_offsets(primes)).cuda()
    m = torch.tensor(engram_multipliers((3, 11), 4, 129280)).cuda()
    tm = torch.randint(0, 129280, (129280,), generator=torch.Generator().manual_seed(11)).cuda()
    hash_ids = reg.impl("engram.hash_ids", "triton")
    check_rows(lambda rows: hash_ids(torch.stack([r[0] for r in rows]).cuda(),
                                     torch.stack([r[1] for r in rows]).cuda(), tm, 5, m, p, o),
               lambda g: (torch.randint(0, 129280, (4,), generator=g), torch.rand(4, generator=g) > 0.1))

# -- cache writes -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_write_rows_rows(reg, dtype):
    """cache.write_rows: a row's stored bits (fp32 rows cast to the cache dtype, or left untouched when its
    slot is -1) do not depend on the other rows of the call."""
    fn = reg.impl("cache.write_rows", "triton")

    def make_row(g):
        return torch.randn(512, generator=g) * 3, bool(torch.rand((), generator=g) < 0.8)

    def run(rows):
        m = len(rows)
        cache = torch.full((m + 5, 512), float("nan"), dtype=dtype, device="cuda")
        slots = torch.tensor([i + 5 if kept else -1 for i, (_, kept) in enumerate(rows)], device="cuda")
        fn(cache, slots, torch.stack([r[0] for r in rows]).cuda(), None)
        return [cache[i + 5] for i in range(m)]  # row i's slot (still NaN when not kept)

    check_rows(run, make_row)


# -- routed experts ---------------------------------------------------------------------------------
def _routing_row(e, k, d):
    def make(g):
        return torch.randn(d, generator=g), torch.rand(k, generator=g), torch.randperm(e, generator=g)[:k]
    return make


def _run_experts(fn, dtype, weights):
    def run(rows):
        x = torch.stack([r[0] for r in rows]).to(dtype).cuda()
        return fn(x, torch.stack([r[1] for r in rows]).cuda(), torch.stack([r[2] for r in rows]).cuda(), *weights)
    return run


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_mxfp4_rows(reg, dtype):
    from deepinfer_core.kernels.ops.quant import quant_mxfp4

    e, k, d, f = 16, 6, 2048, 1024  # 16 experts: at M = 1000 each holds ~375 pairs, many blocks per expert
    g = torch.Generator().manual_seed(8)

    def stack(n, kk):
        q = [quant_mxfp4(torch.randn(n, kk, generator=g) / kk ** 0.5) for _ in range(e)]
        return torch.stack([a for a, _ in q]).cuda(), torch.stack([b for _, b in q]).cuda()

    ws = (*stack(f, d), *stack(f, d), *stack(d, f), 1.0)
    check_rows(_run_experts(reg.impl("moe.experts_mxfp4", "triton_bi"), dtype, ws), _routing_row(e, k, d))


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_fp8_and_dense_rows(reg, dtype):
    from deepinfer_core.kernels.ops.quant import quant_fp8_block

    e, k, d, f, block = 8, 2, 512, 256, (128, 128)
    g = torch.Generator().manual_seed(9)

    def stack(n, kk):
        q = [quant_fp8_block(torch.randn(n, kk, generator=g) / kk ** 0.5, block, "ue8m0") for _ in range(e)]
        return torch.stack([a for a, _ in q]).cuda(), torch.stack([b for _, b in q]).cuda()

    ws = (*stack(f, d), *stack(f, d), *stack(d, f), block, 1.0)
    check_rows(_run_experts(reg.impl("moe.experts_fp8", "triton_bi"), dtype, ws), _routing_row(e, k, d),
               sizes=(2, 7, 64, 300))
    dense = tuple((torch.randn(e, n, kk, generator=g) / kk ** 0.5).cuda() for n, kk in ((f, d), (f, d), (d, f)))
    dense += (1.0,)
    check_rows(_run_experts(reg.impl("moe.experts", "triton_bi"), dtype, dense), _routing_row(e, k, d),
               sizes=(2, 7, 64, 300))


def test_batch_invariant_mode_resolution():
    """In batch-invariant mode the V4 / V4.1 ops resolve to invariant providers (triton_bi first), else references;
    in default mode no triton_bi launch is used."""
    from deepinfer_core.kernels.mode import kernel_mode
    from deepinfer_core.kernels.registry import KernelRegistry
    from deepinfer_core.kernels.ops import register_builtin_ops
    from deepinfer_core.kernels.resolve import ensure_platform_kernels
    from deepinfer_models.deepseek_v4.model import KERNEL_OPS
    from deepinfer_nvidia.platform import NvidiaPlatform

    plat = NvidiaPlatform()
    r = KernelRegistry()
    register_builtin_ops(r)
    ensure_platform_kernels(r, plat)
    bi_ops = {op for op, prov in INVARIANT if prov == "triton_bi"}
    with kernel_mode(batch_invariant=True):
        chosen = {op: r.resolve(op, plat.default_providers)[0] for op in KERNEL_OPS}
    print("batch-invariant mode:", chosen)
    for op, prov in chosen.items():
        assert prov == "reference" or (op, prov) in INVARIANT, (op, prov)
        if op in bi_ops:
            assert prov == "triton_bi", (op, prov)
    with kernel_mode(batch_invariant=False):
        assert all(r.resolve(op, plat.default_providers)[0] != "triton_bi" for op in KERNEL_OPS)
