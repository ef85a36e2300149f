"""KV compressor pooling (DeepSeek-V4 CSA/HCA, V4.1 ratio 2).

A window of ``S`` slots (tokens, or token halves for the overlapping CSA) is
pooled into one entry by a per-channel softmax over the slots of the gate
scores. Slots that do not exist carry score ``-inf`` (weight 0).

``compress.ring_pair_pool`` is a V4.1 ratio-2 compressor's whole decode step around that pool: each request's
token closes the pair (p - 1, p) when p is odd, its partner row waits in the request's ring of recent ``kv | z``
rows, and the token's own row goes into the ring for a later pair. Composed from ``compress.softmax_pool`` and
``cache.write_rows`` with the index math between them; a platform may do it in one launch.

``compress.entry_write`` is what every compressor does with its pooled rows ``u``: the RMSNorm (fp32, rounded to the
activation dtype: the latent), the RoPE of the latent's tail at the group's first position, and the store of that
entry into the compressed cache. Composed from ``norm.rms``, ``rope.interleaved`` and ``cache.write_rows``; a
platform may do it in one launch.
"""
from __future__ import annotations

import torch

from deepinfer_core.kernels.ops.cache import same_bits, write_rows
from deepinfer_core.kernels.ops.linalg import down, up
from deepinfer_core.kernels.ops.norm import rms_norm
from deepinfer_core.kernels.ops.rope import apply_rope, default_inv_freq
from deepinfer_core.kernels.spec import OpSpec, acc


def softmax_pool(kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """kv [N, S, d] float; score [N, S, d] fp32 (``-inf`` = absent slot). Returns [N, d] in kv.dtype.

    ``out[n, c] = sum_s softmax_s(score[n, :, c]) * kv[n, s, c]``; the softmax is fp32.
    Absent slots (score -inf) contribute exactly zero even if kv holds garbage there.
    """
    w = down(up(score).softmax(dim=1), acc(score))
    kvz = torch.where(torch.isneginf(score), torch.zeros_like(kv), kv)
    return (kvz * w.to(kv.dtype)).sum(dim=1)


def _gen_pool(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for n, s, d in [(1, 2, 8), (5, 8, 64), (3, 128, 512)]:
        kv = torch.randn(n, s, d, generator=g).to(dtype).to(device)
        sc = torch.randn(n, s, d, generator=g).float()
        sc[:, : s // 4] = float("-inf") if s >= 4 else sc[:, : s // 4]
        yield (kv, sc.to(device)), {}


RING_PAIR_PARTS = ("compress.softmax_pool", "cache.write_rows")
_INTS = (torch.int64, torch.int32)


def check_ring_pair_pool(both: torch.Tensor, ring: torch.Tensor, slot: torch.Tensor, pos: torch.Tensor) -> None:
    """``compress.ring_pair_pool``'s operand contract (host-side metadata only; the providers raise the same)."""
    if both.dim() != 2 or both.shape[1] % 2 or not both.is_floating_point():
        raise ValueError(f"compress.ring_pair_pool: both must be a float [T, 2d], got {both.dtype} {tuple(both.shape)}")
    if ring.dim() != 3 or ring.shape[2] != both.shape[1] or ring.shape[1] < 2 or ring.dtype != both.dtype:
        raise ValueError(f"compress.ring_pair_pool: ring must be [S, C >= 2, {both.shape[1]}] {both.dtype}, got "
                         f"{ring.dtype} {tuple(ring.shape)}")
    for name, v in (("slot", slot), ("pos", pos)):
        if tuple(v.shape) != (both.shape[0],) or v.dtype not in _INTS:
            raise ValueError(f"compress.ring_pair_pool: {name} must be int64 / int32 [{both.shape[0]}], got "
                             f"{v.dtype} {tuple(v.shape)}")


def compose_ring_pair_pool(k: dict):
    """``compress.ring_pair_pool`` from its parts ``k`` (``RING_PAIR_PARTS``)."""
    pool, write = k["compress.softmax_pool"], k["cache.write_rows"]

    def ring_pair_pool(both: torch.Tensor, ring: torch.Tensor, slot: torch.Tensor, pos: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A ratio-2 compressor's decode step (each row is one request's only token). both [T, 2d] (the token's
        ``kv | z``), ring [S, C, 2d] (each request's recent rows at ``p % C``, same dtype), slot [T] (the row's
        ring; distinct, in [0, S)), pos [T] (>= 0). Returns ``(u [T, d], closes [T] bool, ring)``: u is the
        ``compress.softmax_pool`` of the pair (ring[slot, (p - 1) % C], both) in both's dtype, meaningful where
        ``closes`` (p odd); then both is written into ring[slot, p % C] (in place, after the partner's read). The
        ring is returned so the shared harness compares it."""
        check_ring_pair_pool(both, ring, slot, pos)
        cap, w = ring.shape[1], ring.shape[2]
        d = w // 2
        partner = ring[slot, (pos - 1) % cap]  # [T, 2d], read before the write below
        pair = torch.stack([partner, both], dim=1)  # [T, 2, 2d]: the pair's positions in order
        u = pool(pair[..., :d], pair[..., d:])
        write(ring.view(-1, w), slot * cap + pos % cap, both)
        return u, pos % 2 == 1, ring

    return ring_pair_pool


ring_pair_pool = compose_ring_pair_pool({"compress.softmax_pool": softmax_pool, "cache.write_rows": write_rows})


def _gen_ring_pair(dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    for t, d, cap in [(1, 8, 8), (3, 64, 8), (8, 512, 8), (5, 24, 2)]:
        n = t + 3
        both = torch.randn(t, 2 * d, generator=g).to(dtype)
        ring = torch.randn(n, cap, 2 * d, generator=g).to(dtype)
        slot = torch.randperm(n, generator=g)[:t]
        pos = torch.randint(0, 200, (t,), generator=g)
        if t > 2:
            pos[0] = 0  # position 0: no partner yet (not closing)
        yield (both.to(device), ring.to(device), slot.to(device), pos.to(device)), {}


def _compare_ring_pair(out, ref, dtype) -> None:
    """u within the pool's tolerance where the pair closes (elsewhere it is unspecified), closes and the ring exact."""
    (u, closes, ring), (u_ref, closes_ref, ring_ref) = out, ref
    assert torch.equal(closes.cpu(), closes_ref.cpu()), "compress.ring_pair_pool: closes differ"
    same_bits(ring.cpu(), ring_ref.cpu(), dtype)
    rtol, atol = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}.get(dtype, (1e-5, 1e-5))
    m = closes_ref.cpu()
    torch.testing.assert_close(u.cpu()[m].float(), u_ref.cpu()[m].float(), rtol=rtol, atol=atol)


ENTRY_WRITE_PARTS = ("norm.rms", "rope.interleaved", "cache.write_rows")


def check_entry_write(u: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                      cache: torch.Tensor, slots: torch.Tensor, keep: torch.Tensor | None, ratio: int) -> None:
    """``compress.entry_write``'s operand contract (host-side metadata only; the providers raise the same)."""
    if u.dim() != 2 or not u.is_floating_point():
        raise ValueError(f"compress.entry_write: u must be a float [G, d], got {u.dtype} {tuple(u.shape)}")
    g, d = u.shape
    if tuple(weight.shape) != (d,):
        raise ValueError(f"compress.entry_write: weight must be [{d}], got {tuple(weight.shape)}")
    if inv_freq.dim() != 1 or 2 * inv_freq.shape[0] > d:
        raise ValueError(f"compress.entry_write: inv_freq must be [R/2] with R <= {d}, got {tuple(inv_freq.shape)}")
    if cache.dim() != 2 or cache.shape[1] != d:
        raise ValueError(f"compress.entry_write: cache must be [N, {d}], got {tuple(cache.shape)}")
    for name, v in (("positions", positions), ("slots", slots)):
        if tuple(v.shape) != (g,) or v.dtype not in _INTS:
            raise ValueError(f"compress.entry_write: {name} must be int64 / int32 [{g}], got {v.dtype} "
                             f"{tuple(v.shape)}")
    if keep is not None and (tuple(keep.shape) != (g,) or keep.dtype != torch.bool):
        raise ValueError(f"compress.entry_write: keep must be bool [{g}] or None, got {keep.dtype} "
                         f"{tuple(keep.shape)}")
    if not isinstance(ratio, int) or ratio < 1:
        raise ValueError(f"compress.entry_write: ratio must be a positive int, got {ratio!r}")


def group_starts(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """The first position of each position's group, ``p // r * r`` for p >= 0: no launch at ratio 1, one (a bit
    mask) for a power of two."""
    if ratio == 1:
        return positions
    return positions & -ratio if ratio & (ratio - 1) == 0 else positions // ratio * ratio


def compose_entry_write(k: dict):
    """``compress.entry_write`` from its parts ``k`` (``ENTRY_WRITE_PARTS``)."""
    rms, rope, write = k["norm.rms"], k["rope.interleaved"], k["cache.write_rows"]

    def entry_write(u: torch.Tensor, weight: torch.Tensor, eps: float, positions: torch.Tensor,
                    inv_freq: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor,
                    keep: torch.Tensor | None = None, *, ratio: int = 1, dtype: torch.dtype | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The compressed entries of G closing groups. u [G, d] float (the pooled rows), weight [d] float (the
        compressor's norm), positions [G] int >= 0 (a position in each group), inv_freq [R/2] fp32, cache [N, d]
        (any dtype), slots [G] int (-1: not written), keep [G] bool or None (all rows). Returns
        ``(latent [G, d] dtype, at [G], cache)``: ``latent = norm.rms(u, weight, eps)`` rounded to ``dtype``
        (default u's), ``at`` the groups' first positions (``p // ratio * ratio``, positions' dtype), and
        ``rope.interleaved(latent, at, inv_freq)`` stored by ``cache.write_rows(cache, slots, ., keep)`` (in place;
        returned so the shared harness compares it)."""
        check_entry_write(u, weight, positions, inv_freq, cache, slots, keep, ratio)
        latent = rms(u, weight, eps).to(dtype or u.dtype)
        at = group_starts(positions, ratio)
        write(cache, slots, rope(latent, at, inv_freq), keep)
        return latent, at, cache

    return entry_write


entry_write = compose_entry_write({"norm.rms": rms_norm, "rope.interleaved": apply_rope,
                                   "cache.write_rows": write_rows})


def _gen_entry_write(dtype, device, seed):
    """u in ``dtype`` (fp32 in the models) rounded to bf16 latents; caches of bf16 and of u's dtype; every slot
    pattern (distinct, some -1, some not kept)."""
    g = torch.Generator().manual_seed(seed)
    for n_rows, d, rd, ratio, cache_dtype, with_keep in [(1, 512, 64, 2, torch.bfloat16, False),
                                                         (5, 512, 64, 1, torch.bfloat16, True),
                                                         (7, 96, 16, 4, dtype, True), (3, 64, 64, 3, dtype, False)]:
        u = (3 * torch.randn(n_rows, d, generator=g)).to(dtype)
        w = (1 + 0.1 * torch.randn(d, generator=g)).float()
        pos = torch.randint(0, 70000, (n_rows,), generator=g)
        n = n_rows + 4
        slots = torch.randperm(n, generator=g)[:n_rows]
        slots[-1] = -1 if n_rows > 2 else slots[-1]
        keep = torch.rand(n_rows, generator=g) > 0.3 if with_keep else None
        cache = torch.randn(n, d, generator=g).to(cache_dtype)
        args = (u, w, 1e-6, pos, default_inv_freq(rd, 10000.0), cache, slots, keep)
        yield tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args), {
            "ratio": ratio, "dtype": torch.bfloat16}


def _compare_entry_write(out, ref, dtype) -> None:
    """latent and the cache within rope's bf16 tolerance, ``at`` exact."""
    (lat, at, cache), (lat_ref, at_ref, cache_ref) = out, ref
    assert torch.equal(at.cpu(), at_ref.cpu()), "compress.entry_write: group starts differ"
    for a, b in ((lat, lat_ref), (cache, cache_ref)):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
        torch.testing.assert_close(a.cpu().float(), b.cpu().float(), rtol=3e-2, atol=3e-2)


OPS = [OpSpec("compress.softmax_pool", softmax_pool, _gen_pool),
       OpSpec("compress.ring_pair_pool", ring_pair_pool, _gen_ring_pair, compare=_compare_ring_pair,
              components=RING_PAIR_PARTS, compose=compose_ring_pair_pool,
              doc="a ratio-2 compressor's decode step: the pair's pool from the ring, the token into the ring"),
       OpSpec("compress.entry_write", entry_write, _gen_entry_write, compare=_compare_entry_write,
              components=ENTRY_WRITE_PARTS, compose=compose_entry_write,
              doc="a compressor's entries: the norm, the latent's RoPE at the group start, the cache store")]
