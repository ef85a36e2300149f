"""Static checks of the swap-AB wgmma FP8 GEMV's machine code (``gluon_fp8_gemv``), no GPU needed: the
installed Triton compiles it for sm_90a and ``deepinfer_nvidia.tests.sass_count`` finds the main loop. Asserted:
the e4m3 tile moves as 16-byte ``cp.async``; 8 ``wgmma`` (``HGMMA.64xN``) per 128-column tile with the 8 or 16
activation rows as N; the decoded tile never goes through shared memory (the registers are the A fragment);
fewer than 5 instructions per weight byte (the CUDA-core GEMV: 6.0 at [32, 32] blocks); constexpr scale blocks,
so no integer division in the loop."""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
gg = pytest.importorskip("deepinfer_nvidia.kernels.gluon_fp8_gemv")

from deepinfer_nvidia.tests.sass_count import count, missing_tools  # noqa: E402

if missing_tools(gg):
    pytest.skip(missing_tools(gg), allow_module_level=True)

SIG = {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*u8", "y_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32",
       "M": "i32", "N": "i32", "K": "i32", "stride_x": "i32", "s_cols": "i32", "NG": "i32", "k_per_split": "i32"}


@pytest.mark.parametrize("split,block_m,blk,safe", [(4, 8, 32, 0), (4, 16, 128, 0), (2, 8, 32, 1)])
def test_loop(split, block_m, blk, safe):
    consts = {"BN_BLK": blk, "BK_BLK": blk, "SPLIT": split, "BLOCK_M": block_m, "STAGES": 3, "SAFE": safe,
              "num_warps": 4}
    r = count(gg._wgmma_gemv_kernel, SIG, consts, warps=4, div16=frozenset({"N", "K", "stride_x", "k_per_split"}))
    ops, n = r["ops"], len(r["loop"])

    def has(prefix):
        return sum(v for k, v in ops.items() if k.startswith(prefix))

    assert has(f"HGMMA.64x{block_m}x16") == 8, ops
    assert has("LDGSTS") and all(".128" in k for k in ops if k.startswith("LDGSTS.E.BYPASS")), ops
    assert has("STS") == 0, ("the decoded tile went through shared memory", ops)
    assert has("HMUL2") == 32 * (2 if safe else 1), ops
    assert not has("I2F") and not has("MUFU"), ("an integer division in the loop", ops)
    assert n / 64 < (5.0 if not safe else 5.6), (n / 64, ops)
