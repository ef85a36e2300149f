"""``compress.entry_write`` in one Triton launch: a compressor's pooled rows normed, rotated and stored.

Composed, a compressor's entries take ``norm.rms`` (fp32 out), a cast to the activation dtype, the group starts
(``p & -r``), ``rope.interleaved`` and ``cache.write_rows``: four or five launches on the kv source's side branch,
which at batch 1 outlasts the layer's query half (pass45d, H100: the ratio-2 source's branch still ends ~10 us
after the main stream wants it). Here one program a row does all of it:

1. ``latent = w * u * rsqrt(mean(u^2) + eps)`` in fp32 (``_rms_kernel``'s steps), rounded to the latent's dtype and
   stored (the index keys' projection reads it);
2. ``at = p // r * r`` stored (the index keys' RoPE position);
3. the latent's head channels go to ``cache[slot]`` as they are; its tail pairs are normed again from their even
   and odd lanes (the same fp32 steps, so the same rounded values), rotated by ``at``'s angles as ``_rope_kernel``
   rotates them, rounded to the latent's dtype (rope's output) and stored in the cache's dtype. A slot < 0, >= N or
   not kept is not written.

One program a row, tiles from d only: batch-invariant. No host synchronisation (capturable). Covered: CUDA
contiguous u [G, d] fp32/bf16/fp16 (d <= 8192), cache [N, d] contiguous fp32/bf16/fp16 (an FP8 cache would need
torch's rounding of the cast, which this kernel does not claim); the rest runs the reference composition. ``force_kernel=True`` skips the device check only (the interpreter tests).

On since the forty-sixth pass (``DEEPINFER_NV_COMPRESS_ENTRY_FUSED=0``, read at import, turns it off): alone it
measured even (pass46a, H100: batch 1 2.047 -> 2.045 ms pipelined, four readings an arm); with ``norm.rms_rope``'s
kernel, never slower (pass46c/d: batch 1 -8 us, batch 32 -37 us over six readings an arm, inside the spread). Off,
the op is this platform's parts (``triton_norm.rms``, ``triton_rope.rope``, ``triton_cache.write_rows``): the launches
and bits the model had before the op.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepinfer_core.kernels.ops.compress import check_entry_write, compose_entry_write
from deepinfer_core.kernels.ops.compress import entry_write as ref_entry_write
from deepinfer_nvidia.kernels._common import FLOATS, hand_off, next_pow2, on_cuda
from deepinfer_nvidia.kernels.triton_pdl import pdl_enter, pdl_launch
from deepinfer_nvidia.kernels.triton_rope import angles_at, normed_tail_pairs

MAX_D = 8192  # the row is held in registers
FUSED = os.environ.get("DEEPINFER_NV_COMPRESS_ENTRY_FUSED", "1") == "1"
_PARTS = []  # the op as this platform's parts, built at first use (imports the three kernels' modules)


def _parts():
    if not _PARTS:
        from deepinfer_nvidia.kernels.triton_cache import write_rows
        from deepinfer_nvidia.kernels.triton_norm import rms
        from deepinfer_nvidia.kernels.triton_rope import rope
        _PARTS.append(compose_entry_write({"norm.rms": rms, "rope.interleaved": rope, "cache.write_rows": write_rows}))
    return _PARTS[0]


@triton.jit
def _kept(slot, keep_ptr, g, N, SIZE: tl.constexpr, HAS_KEEP: tl.constexpr):
    """[SIZE] bool, all lanes alike: is the row's slot in [0, N) and (HAS_KEEP) the row kept. A tile, so the masks
    made from it broadcast as tensors."""
    s = slot + tl.zeros([SIZE], dtype=tl.int64)
    ok = (s >= 0) & (s < N)
    if HAS_KEEP:
        ok = ok & (tl.load(keep_ptr + g + tl.zeros([SIZE], dtype=tl.int64)) != 0)
    return ok


@triton.jit
def _entry_kernel(u_ptr, w_ptr, pos_ptr, f_ptr, cache_ptr, slot_ptr, keep_ptr, lat_ptr, at_ptr, N, D, eps,
                  RATIO: tl.constexpr, HALF: tl.constexpr, HAS_KEEP: tl.constexpr, BLOCK: tl.constexpr,
                  BLOCK_H: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_enter(PDL)
    g = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    cm = cols < D
    row = u_ptr + g * D
    x = tl.load(row + cols, mask=cm, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=cm, other=0.0).to(tl.float32)
    lat = (w * (x * inv)).to(lat_ptr.dtype.element_ty)
    tl.store(lat_ptr + g * D + cols, lat, mask=cm)
    p = tl.load(pos_ptr + g)
    at = p // RATIO * RATIO  # p >= 0: the group's first position
    tl.store(at_ptr + g, at)
    slot = tl.load(slot_ptr + g).to(tl.int64)
    dest = cache_ptr + slot * D
    out_ty = cache_ptr.dtype.element_ty
    ok = _kept(slot, keep_ptr, g, N, BLOCK, HAS_KEEP) & (cols < D - 2 * HALF)
    tl.store(dest + cols, lat.to(out_ty), mask=ok)
    # the tail pairs (2i, 2i + 1) of the rounded latent, rotated by the group start's angles
    i = tl.arange(0, BLOCK_H)
    imask = i < HALF
    ca, a, b = normed_tail_pairs(row, w_ptr, inv, i, imask, D, HALF, lat_ptr.dtype.element_ty)
    c, s = angles_at(at, i, imask, f_ptr, False)
    ok_h = _kept(slot, keep_ptr, g, N, BLOCK_H, HAS_KEEP) & imask
    tl.store(dest + ca, (a * c - b * s).to(lat_ptr.dtype.element_ty).to(out_ty), mask=ok_h)
    tl.store(dest + ca + 1, (b * c + a * s).to(lat_ptr.dtype.element_ty).to(out_ty), mask=ok_h)


def _uncovered(u, weight, positions, inv_freq, cache, slots, keep, force: bool) -> str | None:
    if not (force or on_cuda(u, weight, positions, inv_freq, cache, slots, *(() if keep is None else (keep,)))):
        return "operands not on a CUDA device"
    if not (u.dtype in FLOATS and u.is_contiguous() and u.shape[1] <= MAX_D and weight.is_floating_point()
            and inv_freq.is_floating_point() and cache.dtype in FLOATS and cache.is_contiguous()):
        return "u / cache layouts or dtypes not covered"
    return None


def supports(u, weight, eps, positions, inv_freq, cache, slots, keep=None, *, ratio=1, dtype=None) -> bool:
    """CUDA contiguous u [G, d <= ``MAX_D``] fp32/bf16/fp16 and a contiguous fp32/bf16/fp16 cache (the contract's
    other checks raise)."""
    return _uncovered(u, weight, positions, inv_freq, cache, slots, keep, False) is None


def entry_write(u: torch.Tensor, weight: torch.Tensor, eps: float, positions: torch.Tensor, inv_freq: torch.Tensor,
                cache: torch.Tensor, slots: torch.Tensor, keep: torch.Tensor | None = None, *, ratio: int = 1,
                dtype: torch.dtype | None = None, force_kernel: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``compress.entry_write``: (latent [G, d] ``dtype``, at [G] positions' dtype, cache written in place). Kept
    slots must be distinct (as ``cache.write_rows`` asks); the reference's contract errors are raised first. The
    parts where ``FUSED`` is off (``force_kernel``: the kernel, also on CPU tensors in Triton's interpreter)."""
    check_entry_write(u, weight, positions, inv_freq, cache, slots, keep, ratio)
    if not (FUSED or force_kernel):
        return _parts()(u, weight, eps, positions, inv_freq, cache, slots, keep, ratio=ratio, dtype=dtype)
    why = _uncovered(u, weight, positions, inv_freq, cache, slots, keep, force_kernel)
    if why:
        return hand_off("compress.entry_write", why, ref_entry_write, u, weight, eps, positions, inv_freq, cache,
                        slots, keep, ratio=ratio, dtype=dtype)
    g, d = u.shape
    latent = torch.empty(g, d, dtype=dtype or u.dtype, device=u.device)
    at = torch.empty_like(positions)
    if g == 0 or d == 0:
        return latent, at, cache
    half = inv_freq.shape[0]
    _entry_kernel[(g,)](u, weight.contiguous(), positions.contiguous(), inv_freq.contiguous(), cache,
                        slots.contiguous(), keep if keep is not None else slots, latent, at, cache.shape[0], d,
                        float(eps), RATIO=int(ratio), HALF=half, HAS_KEEP=keep is not None, BLOCK=next_pow2(d),
                        BLOCK_H=next_pow2(max(half, 1)), num_warps=4 if d <= 4096 else 8, **pdl_launch())
    return latent, at, cache
