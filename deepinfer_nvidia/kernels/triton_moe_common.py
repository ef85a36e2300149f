"""Triton helpers the MoE expert kernels share (``triton_moe``, ``triton_moe_fp8``, ``triton_moe_splitk``,
``triton_moe_segments``): a grouped kernel's tile of aligned pair slots, and the reference's clamped SwiGLU with its
roundings. Inlined into each kernel, so moving them here changes no kernel's code."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _expert_block(pair_ptr, pid_b, pid_n, P, n_out, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A grouped kernel's tile: block ``pid_b`` of the aligned pair slots (one expert's ``BLOCK_M`` slots, pads hold
    pair ids >= P) and output columns ``pid_n``. Returns rows [BLOCK_M] (slot indices), pair [BLOCK_M] int32,
    valid (pair < P), rn [BLOCK_N] and nmask (rn < n_out)."""
    rows = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pair_ptr + rows)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return rows, pair, pair < P, rn, rn < n_out


@triton.jit
def _swiglu(a1, a3, limit, dtype: tl.constexpr):
    """The reference's clamped SwiGLU on fp32 gate / up sums: silu(min(g, L)) * clamp(u, -L, L), roundings to dtype."""
    g = tl.minimum(a1.to(dtype).to(tl.float32), limit).to(dtype).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    u = tl.minimum(tl.maximum(a3.to(dtype).to(tl.float32), -limit), limit).to(dtype).to(tl.float32)
    return (s * u).to(dtype)
