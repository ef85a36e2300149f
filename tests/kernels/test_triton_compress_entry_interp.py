"""``compress.entry_write``'s Triton kernel (``deepinfer_nvidia/kernels/triton_compress_entry.py``) in Triton's CPU
interpreter: against the reference composition (``norm.rms``, the cast, the group starts, ``rope.interleaved``,
``cache.write_rows``) on the op's shared cases; the latent within a rounding of ``norm.rms``'s kernel, the entries
bit-equal to ``rope.interleaved``'s kernel on that latent; slots that are -1, out of range or not kept
leave the cache as it was."""
from __future__ import annotations

_INTERPRETED = r"""
import torch
from deepinfer_core.kernels.ops.compress import _compare_entry_write, _gen_entry_write, entry_write
from deepinfer_nvidia.kernels import triton_compress_entry as te
from deepinfer_nvidia.kernels.triton_norm import _launch as rms_kernel
from deepinfer_nvidia.kernels.triton_rope import _rope_kernel
from deepinfer_nvidia.kernels._common import next_pow2

def rope_kernel(x, pos, inv_freq):  # rope.interleaved's kernel, launched as its wrapper launches it
    y = torch.empty_like(x)
    half = inv_freq.shape[0]
    _rope_kernel[(x.shape[0], 1)](x, y, pos, inv_freq, 1, x.shape[1], HALF=half, INVERSE=False, ROWS=1,
                                  BLOCK_D=next_pow2(x.shape[1]), BLOCK_H=next_pow2(half))
    return y

n = 0
for dtype in (torch.float32, torch.bfloat16):
    for seed in range(2):
        for args, kw in _gen_entry_write(dtype, "cpu", seed):
            u, w, eps, pos, inv, cache, slots, keep = args
            cache_k, cache_r = cache.clone(), cache.clone()
            got = te.entry_write(u, w, eps, pos, inv, cache_k, slots, keep, force_kernel=True, **kw)
            want = entry_write(u, w, eps, pos, inv, cache_r, slots, keep, **kw)
            _compare_entry_write(got, want, dtype)
            assert got[2] is cache_k
            # the latent within a bf16 rounding of norm.rms's kernel (the two reduce the row in different trees)
            lat = rms_kernel(u, w, eps).to(kw["dtype"])
            torch.testing.assert_close(got[0].float(), lat.float(), rtol=8e-3, atol=1e-5)
            ent = rope_kernel(got[0], got[1], inv).to(cache.dtype)
            written = (slots >= 0) if keep is None else (slots >= 0) & keep
            assert torch.equal(cache_k[slots[written]], ent[written]), "not rope.interleaved's kernel's bits"
            untouched = torch.ones(cache.shape[0], dtype=torch.bool)
            untouched[slots[written]] = False
            assert torch.equal(cache_k[untouched], cache[untouched]), "a row outside the kept slots was written"
            n += 1
# slots out of range (>= N) and not kept: nothing written
u, w, inv = torch.randn(3, 32), torch.ones(32), torch.ones(4)
cache = torch.randn(4, 32)
before = cache.clone()
lat, at, _ = te.entry_write(u, w, 1e-6, torch.tensor([3, 4, 9]), inv, cache, torch.tensor([7, -1, 1]),
                            torch.tensor([True, True, False]), ratio=2, dtype=torch.bfloat16, force_kernel=True)
assert torch.equal(cache, before) and at.tolist() == [2, 4, 8] and lat.dtype == torch.bfloat16
print("INTERPRETED", n)
"""


def test_entry_write_kernel_in_the_interpreter(run_interpreted):
    proc = run_interpreted(_INTERPRETED, "INTERPRETED")
    assert int(proc.stdout.split("INTERPRETED")[-1].split()[0]) == 16


def test_entry_write_contract_errors():
    """Bad operands name what is wrong, on the reference and the provider alike (before any launch)."""
    import pytest
    import torch

    from deepinfer_core.kernels.ops.compress import entry_write

    u, w, inv, cache = torch.randn(2, 16), torch.ones(16), torch.ones(4), torch.zeros(4, 16)
    pos, slots = torch.tensor([1, 3]), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="weight must be"):
        entry_write(u, torch.ones(8), 1e-6, pos, inv, cache, slots)
    with pytest.raises(ValueError, match="cache must be"):
        entry_write(u, w, 1e-6, pos, inv, torch.zeros(4, 8), slots)
    with pytest.raises(ValueError, match="positions must be"):
        entry_write(u, w, 1e-6, pos.float(), inv, cache, slots)
    with pytest.raises(ValueError, match="keep must be"):
        entry_write(u, w, 1e-6, pos, inv, cache, slots, torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="ratio must be"):
        entry_write(u, w, 1e-6, pos, inv, cache, slots, ratio=0)
    with pytest.raises(ValueError, match="inv_freq must be"):
        entry_write(u, w, 1e-6, pos, inv.repeat(3), cache, slots)


def test_entry_kernel_compiles_for_sm90():
    """The model's launch (fp32 u of 512, a 64-wide tail, bf16 latent and cache, keep given) compiles for sm_90a with
    no GPU: the PDL wait before any global access, and no more local memory than the plain ``_rope_kernel`` (libdevice's
    never-taken sin / cos slow path for huge arguments: angles are reduced modulo 2 pi in fp64 first)."""
    import pytest

    pytest.importorskip("triton")
    te = pytest.importorskip("deepinfer_nvidia.kernels.triton_compress_entry")
    from deepinfer_nvidia.tests.sass_count import count, missing_tools, opcodes

    if missing_tools(te):
        pytest.skip(missing_tools(te))
    sig = {"u_ptr": "*fp32", "w_ptr": "*fp32", "pos_ptr": "*i64", "f_ptr": "*fp32", "cache_ptr": "*bf16",
           "slot_ptr": "*i64", "keep_ptr": "*i1", "lat_ptr": "*bf16", "at_ptr": "*i64", "N": "i32", "D": "i32",
           "eps": "fp32"}
    res = count(te._entry_kernel, sig, {"RATIO": 2, "HALF": 32, "HAS_KEEP": 1, "BLOCK": 512, "BLOCK_H": 32,
                                        "PDL": 1}, warps=4)
    ops = opcodes(res["sass"])
    first_access = min(i for i, o in enumerate(ops) if o.startswith(("LDG", "STG", "LD.", "ST.")))
    assert ops.index("ACQBULK") < ops.index("PREEXIT") < first_access
    assert sum(o.startswith("STG") for o in ops) >= 3  # the latent, the group start, the entry's head and tail
    from deepinfer_nvidia.kernels import triton_rope as tr

    rope = count(tr._rope_kernel, {"x_ptr": "*bf16", "y_ptr": "*bf16", "pos_ptr": "*i64", "f_ptr": "*fp32",
                                   "n_rows": "i32", "D": "i32"},
                 {"HALF": 32, "INVERSE": 0, "ROWS": 1, "BLOCK_D": 512, "BLOCK_H": 32, "PDL": 1}, warps=4)

    def local(sass_ops):
        return sum(o.startswith(("STL", "LDL")) for o in sass_ops)

    assert local(ops) <= local(opcodes(rope["sass"]))
