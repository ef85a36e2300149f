"""``engram.hash_ids``'s Triton launch (``deepinfer_nvidia/kernels/triton_engram_hash.py``): exact against the
reference in Triton's CPU interpreter (the op's own cases, V4.1's primes and multipliers with invalid columns
anywhere, out-of-range window ids, one token), its registration, and its sm_90a compile (int64 XOR reduction and
modulo, PDL wait first)."""
from __future__ import annotations

import pytest

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops import engram as ref
from deepinfer_models.deepseek_v41.engram_hash import engram_multipliers, engram_offsets, engram_primes
from deepinfer_nvidia.kernels import triton_engram_hash as th

n = 0
for seed in range(3):
    for args, _ in ref._gen_hash(torch.int64, "cpu", seed):
        assert torch.equal(th.hash_ids(*args, force_kernel=True), ref.hash_ids(*args))
        n += 1
g = torch.Generator().manual_seed(3)
for layers, ngram, heads, t in [(2, 4, 8, 37), (1, 3, 4, 1), (3, 2, 16, 5)]:
    primes = engram_primes(layers, ngram, heads, 1_000_000)
    P, O = torch.tensor(primes), torch.tensor(engram_offsets(primes))
    M = torch.tensor(engram_multipliers(tuple(range(layers)), ngram, 129280))
    window = torch.randint(-5, 160000, (t, ngram), generator=g)  # ids past the map and negative ones clamp
    valid = torch.rand(t, ngram, generator=g) > 0.2
    tm = torch.randint(0, 129280, (150000,), generator=g)
    got = th.hash_ids(window, valid, tm, 7, M, P, O, force_kernel=True)
    assert got.shape == (t, layers, (ngram - 1) * heads)
    assert torch.equal(got, ref.hash_ids(window, valid, tm, 7, M, P, O))
    n += 1
print("INTERPRETED", n)
"""


def test_hash_ids_in_the_interpreter(run_interpreted):
    run_interpreted(_INTERPRETED, "INTERPRETED 9")


def test_registered_batch_invariant():
    from deepinfer_nvidia.kernels import IMPLS

    row = next(r for r in IMPLS if r[0] == "engram.hash_ids")
    assert row[1] == "triton" and row[-1] is True


def test_uncovered_operands_go_to_the_reference():
    import torch

    th = pytest.importorskip("deepinfer_nvidia.kernels.triton_engram_hash")
    from deepinfer_core.kernels.ops import engram as ref

    args = next(iter(ref._gen_hash(torch.int64, "cpu", 0)))[0]
    assert not th.supports_hash(*args)  # CPU tensors
    assert torch.equal(th.hash_ids(*args), ref.hash_ids(*args))


def test_compiles_for_sm90_with_the_wait_first():
    pytest.importorskip("triton")
    th = pytest.importorskip("deepinfer_nvidia.kernels.triton_engram_hash")
    from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes

    if missing_tools(th):
        pytest.skip(missing_tools(th))
    sig = {"win_ptr": "*i64", "valid_ptr": "*u8", "map_ptr": "*i64", "mult_ptr": "*i64", "prime_ptr": "*i64",
           "off_ptr": "*i64", "out_ptr": "*i64", "N": "i32", "V": "i32", "H": "i32", "C": "i32", "L": "i32",
           "pad_id": "i32"}
    sass = count(th._hash_kernel, sig, {"NP": 4, "CP": 32, "PDL": 1}, warps=1)["sass"]
    ops = opcodes(sass)
    first_load = min(i for i, o in enumerate(ops) if o.startswith("LDG"))
    assert ops.index("ACQBULK") < ops.index("PREEXIT") < first_load
    assert any(o.startswith("STG") for o in ops)
